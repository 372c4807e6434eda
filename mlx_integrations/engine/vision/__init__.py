"""Vision-language models: images and videos in, text out, on mlx-vlm.

- :mod:`.media`: images and videos from every source form (paths, URLs, data URLs,
  base64), fetched with limits and decoded at the boundary;
- :mod:`.policy`: which local files and hosts a source may name (``MediaPolicy``:
  everything for the caller's own files, restricted for a server);
- :mod:`.vlm`: loading a model through mlx-vlm, formatting its prompt, its decode loop.

``SimpleEngine`` and ``BatchedEngine`` serve a vision model through these; mlx-vlm is
imported only when one loads (the ``[vision]`` extra).
"""
