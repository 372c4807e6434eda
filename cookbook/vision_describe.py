"""Images in: a vision-language model describes an image, then answers from it and from
retrieved notes (a multimodal RAG step), offline.

Run: python cookbook/vision_describe.py [IMAGE]

The model is ``MLXI_EXAMPLE_VISION_MODEL`` (a folder, store alias or pulled Hub id),
by default ``mlx-community/Qwen2.5-VL-3B-Instruct-4bit``: fetch it once with
``mlxi pull mlx-community/Qwen2.5-VL-3B-Instruct-4bit`` (it needs the ``[vision]``
extra: ``pip install "mlx-integrations[vision]"``). The notes are embedded with the demo's
all-MiniLM-L6-v2 (``MLXI_EXAMPLE_EMBEDDINGS``). Without IMAGE, a bar chart is drawn.
"""

from __future__ import annotations

import base64
import sys
import tempfile
from pathlib import Path

from example_model import example_embedder, example_vision_model
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.vectorstores import InMemoryVectorStore

from mlx_integrations.langchain import ChatMLX, MLXEmbeddings

NOTES = [
    "Sales chart legend: red bars are the Quillby shop, blue bars the Brenmoor shop.",
    "The Quillby shop opened in March and sells blue cheese scones.",
    "The Tarrow lighthouse was built in 1874 on the cliffs of Brenmoor.",
    "Quarterly reports are due on the first Monday after the quarter ends.",
]


def draw_chart(path: Path) -> Path:
    """A small bar chart: four red and blue bars on white."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (224, 224), "white")
    draw = ImageDraw.Draw(img)
    for i, height in enumerate((60, 120, 90, 170)):
        x = 20 + i * 50
        draw.rectangle([x, 200 - height, x + 36, 200], fill="red" if i % 2 == 0 else "blue")
    draw.line([10, 200, 214, 200], fill="black", width=2)
    img.save(path)
    return path


def image_block(path: Path) -> dict:
    """A LangChain image content block with the file's bytes (base64)."""
    data = base64.b64encode(path.read_bytes()).decode()
    return {"type": "image", "base64": data, "mime_type": "image/png"}


def main() -> None:
    model, embedder = example_vision_model(), example_embedder()
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(sys.argv[1]) if len(sys.argv) > 1 else draw_chart(Path(tmp) / "chart.png")
        llm = ChatMLX(model=model, temperature=0, max_tokens=64)

        # 1. Describe the image.
        msg = llm.invoke(
            [HumanMessage(content=[image_block(image), {"type": "text", "text": "Describe it."}])]
        )
        print("description:", msg.content)
        print(f"[{msg.usage_metadata['input_tokens']} input tokens, image included]")

        # 2. Multimodal RAG: notes retrieved by the question, the image beside them.
        store = InMemoryVectorStore(MLXEmbeddings(model_name=embedder))
        store.add_documents([Document(page_content=n) for n in NOTES])
        question = "Which shop sold more in the last quarter of the chart?"
        notes = store.similarity_search(question, k=2)
        print("[retrieved]", " | ".join(d.page_content for d in notes))
        context = "\n".join(d.page_content for d in notes)
        answer = llm.invoke(
            [
                SystemMessage(content=f"Answer from the image and these notes:\n{context}"),
                HumanMessage(content=[image_block(image), {"type": "text", "text": question}]),
            ]
        )
        print("answer:", answer.content)


if __name__ == "__main__":
    main()
