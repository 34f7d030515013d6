"""Candidates over a shared prompt as one token tree, for the hf backend's scoring in a single forward pass.

    from simplan.inference.engines.token_trie import path_logprobs, token_trie, trie_attention
    tokens, parents, paths = token_trie([[5, 7], [5, 9]])   # the shared 5 is one node: tokens [5, 7, 9]
    depth, allowed = trie_attention(parents, start=len(prompt))
    scores = path_logprobs(tokens, paths, first, logps)     # each candidate's summed logprob
    inner = inner_nodes(parents)                             # the nodes whose logits are needed: [0]

inference/engines/hf_peft.py runs the trie's tokens after the prompt's KV cache with `allowed` as the
attention mask (each token sees the prompt and its own ancestors) and `start + depth` as positions; a
prefix shared by several candidates, like `put key in`, is then computed once.
"""

from __future__ import annotations

from typing import Any


def token_trie(tails: list[list[int]]) -> tuple[list[int], list[int], list[list[int]]]:
    """The candidates' token sequences as a trie: (token per node, parent node or -1, each tail's node path).

    Nodes are numbered in insertion order, so a parent always precedes its children."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    for tail in tails:
        node, path = -1, []
        for token in tail:
            key = (node, token)
            if key not in children:
                children[key] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = children[key]
            path.append(node)
        paths.append(path)
    return tokens, parents, paths


def trie_attention(parents: list[int], start: int) -> tuple[list[int], Any]:
    """Each node's depth below the prompt, and the positions it may attend to: a [nodes, start + nodes] bool
    tensor, True at the `start` prompt positions, at its ancestors and at itself."""
    import torch

    n = len(parents)
    depth = [0] * n
    allowed = torch.zeros(n, start + n, dtype=torch.bool)
    allowed[:, :start] = True
    for i, parent in enumerate(parents):  # parents come before their children
        if parent >= 0:
            depth[i] = depth[parent] + 1
            allowed[i, start : start + n] = allowed[parent, start : start + n]
        allowed[i, start + i] = True
    return depth, allowed


def inner_nodes(parents: list[int]) -> list[int]:
    """The nodes with children, in order: only their logits predict a candidate's token (a leaf's predict
    nothing scored), so the LM head need not run over the leaves."""
    return sorted({p for p in parents if p >= 0})


def path_logprobs(
    tokens: list[int], paths: list[list[int]], first: Any, logps: Any, rows: dict[int, int] | None = None
) -> list[float]:
    """Each candidate's logprob summed along its trie path: `first` [vocab] holds the logprobs after the prompt's
    last token (they predict each first token), `logps[i]` those after node i (they predict its children), or
    `logps[rows[i]]` when only some nodes' logprobs were computed (`inner_nodes`)."""
    result = []
    for path in paths:
        total = first[tokens[path[0]]]
        for parent, child in zip(path, path[1:]):
            total = total + logps[parent if rows is None else rows[parent], tokens[child]]
        result.append(float(total))
    return result
