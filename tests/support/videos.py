"""Small test videos, written with OpenCV (which mlx-vlm reads videos with)."""

from __future__ import annotations

from pathlib import Path


def make_test_video(path: Path, color: tuple[int, int, int], frames: int = 4) -> Path:
    """Write a 112x112 MP4 of ``frames`` frames at 2 fps: a ``color`` background (BGR)
    with a white band moving down, so frames differ and two colors give two videos."""
    import cv2
    import numpy as np

    path = Path(path)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 2.0, (112, 112))
    try:
        for i in range(frames):
            frame = np.zeros((112, 112, 3), np.uint8)
            frame[:, :] = color
            frame[i * 20 : i * 20 + 20, :] = 255
            writer.write(frame)
    finally:
        writer.release()
    return path
