"""GGUF files (llama.cpp's format) turned into MLX model folders.

- :mod:`.reader`: the header (metadata and tensor table), checked before any tensor is read;
- :mod:`.tokenizer`: the file's tokenizer rebuilt as Hugging Face tokenizer files;
- :mod:`.convert`: the weights, config and chat template written as an MLX model folder.

``mlxi import`` and a ``.gguf`` path given as a model reach it through
:mod:`mlx_integrations.models.importer`.
"""
