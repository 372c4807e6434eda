"""Models from the Hugging Face Hub, through ``huggingface_hub`` and its shared cache.

- :mod:`.pull`: ``pull`` (a repo id and revision into the store) and what a model
  folder's config says of its dtype and quantization;
- :mod:`.downloads`: transfers that stop on Ctrl-C and resume from their partial files;
- :mod:`.hashing`: SHA-256 of files while they download or right after they are written.
"""
