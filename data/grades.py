"""How much a request asks of the agent, read off the expert's path, and the words a grader reads it by.

    from simplan.data.grades import GRADES, expert_grade, request_words
    expert_grade(trajectory, ask_tool="ask")     # "ambiguous" when the expert asked the user first
    request_words(goal, first_observation)       # the words a grader reads (lower-cased, numbers as <num>)

The grades (envs/base.py GRADES and `path_grade`, first match wins):

    ambiguous     the expert asked the user what the request left out (a call to the env's ask tool)
    trivial       the expert only answered or finished: nothing to do in the world
    single-step   one command or tool call (then an answer or finish)
    multi-step    two or more

A grade is what the request *needed*, so it is labelled from an expert's path, never from what an agent did.
The request grader (inference/planning/grading.py) learns to predict it from the goal and the first observation
alone, before the episode; `simplan fit-grader` (evaluation/grading_fit.py) fits it and measures its accuracy.
"""

from __future__ import annotations

import re

from simplan.data.trajectory import Trajectory
from simplan.envs.base import GRADES, path_grade

__all__ = ["GRADES", "NUMBER", "expert_grade", "request_words"]

NUMBER = "<num>"  # "Order 3 kettles" and "Order 12 kettles" read the same: what matters is that a number is there
_WORD = re.compile(r"[a-z]+|\d+(?:\.\d+)?")


def expert_grade(trajectory: Trajectory, ask_tool: str | None) -> str:
    """The grade of the request of an expert's `trajectory` (see the module docstring)."""
    return path_grade((s.action for s in trajectory.steps), ask_tool)


def request_words(goal: str, observation: str) -> list[str]:
    """The request as a grader reads it: the goal's and the first observation's words and word pairs, lower-cased,
    every number one token (so a grade learns "a quantity is named", not which one). Pairs keep "some kettle"
    apart from "3 kettle"; the goal's words are marked so that a word of the request outweighs the same word in a
    long observation."""
    out: list[str] = []
    for prefix, text in (("goal:", goal), ("", observation)):
        words = [NUMBER if w[0].isdigit() else w for w in _WORD.findall(text.lower())]
        out += [prefix + w for w in words]
        out += [f"{prefix}{a}_{b}" for a, b in zip(words, words[1:])]
    return out
