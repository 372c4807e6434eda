"""A small retrieval corpus: passages on distinct topics and questions about each.

The questions avoid repeating the passages' key words where they can, so that a
bag-of-words match would not find every answer and the embeddings have to.
"""

from __future__ import annotations

PASSAGES: dict[str, str] = {
    "mlx": (
        "MLX is an array framework for machine learning on Apple silicon, designed by "
        "Apple's machine learning research team. Arrays live in unified memory, so the CPU "
        "and the GPU work on the same data without copies."
    ),
    "photosynthesis": (
        "Photosynthesis is the process by which green plants use sunlight, water and carbon "
        "dioxide to produce glucose and release oxygen. It takes place in the chloroplasts."
    ),
    "eiffel": (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. It "
        "was completed in 1889 for the World's Fair and is about 330 metres tall."
    ),
    "dehydration": (
        "Dehydration happens when the body loses more fluid than it takes in. Signs include "
        "thirst, dark urine, headache and dizziness; drinking water or oral rehydration "
        "solution treats mild cases."
    ),
    "bread": (
        "To bake a simple loaf, mix flour, water, yeast and salt, knead the dough for ten "
        "minutes, let it rise for an hour, shape it and bake it at 220 degrees Celsius."
    ),
    "interest": (
        "Compound interest is interest calculated on the initial principal and on the "
        "interest accumulated in earlier periods, so savings grow faster over time."
    ),
    "volcano": (
        "A volcano is an opening in the Earth's crust through which molten rock, ash and "
        "gases escape. Magma that reaches the surface is called lava."
    ),
    "marathon": (
        "A marathon is a long-distance running race of 42.195 kilometres. Runners usually "
        "train for several months, building up their weekly mileage gradually."
    ),
}

# (question, key of the passage that answers it)
QUESTIONS: list[tuple[str, str]] = [
    ("Which library lets me train neural networks on a Mac's GPU?", "mlx"),
    ("How do leaves turn light into sugar?", "photosynthesis"),
    ("How high is the famous iron landmark in the French capital?", "eiffel"),
    ("What are the symptoms of not drinking enough?", "dehydration"),
    ("What is a recipe for homemade bread?", "bread"),
    ("Why do my savings grow faster the longer I keep them in the bank?", "interest"),
    ("What is lava and where does it come from?", "volcano"),
    ("How long is the race that people train months for?", "marathon"),
]
