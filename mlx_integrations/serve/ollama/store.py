"""``/api/pull``, ``/api/delete``, ``/api/copy`` and ``/api/create`` on the model store.

Apps that manage models through Ollama's API manage the store
(:mod:`mlx_integrations.models`), as ``mlxi pull``, ``mlxi rm`` and ``mlxi tag`` do:

- ``/api/pull`` fetches a Hugging Face repo id (``org/name``, ``:tag`` naming a
  revision: a branch, tag or commit) into the store, streaming Ollama's progress
  lines (``pulling manifest``, ``pulling <repo>`` with ``total`` and ``completed``
  bytes, ``verifying sha256 digest``, ``writing manifest``, ``success``). Ollama's
  library names (``llama3.2``) are not on the Hub; a name the store already holds
  answers ``success`` at once.
- ``/api/delete`` removes a stored model (unloading it from this server first), or
  only the alias when the name is one.
- ``/api/copy`` gives a stored model another name (a store alias).
- ``/api/create`` builds models from Ollama Modelfiles, which this server cannot run:
  it answers 501 with what to use instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.errors import APIError
from mlx_integrations.serve.ollama import protocol as wire
from mlx_integrations.serve.ollama.names import LATEST, served_name
from mlx_integrations.serve.ollama.ndjson import json_answer, line, ndjson_reply
from mlx_integrations.serve.replies import Accepted
from mlx_integrations.serve.state import ServerState

__all__ = ["copy", "create", "delete", "pull"]


def store_error(exc: BaseException) -> APIError:
    """The HTTP error of a store error: its message and its hint."""
    from mlx_integrations.models import errors

    hint = getattr(exc, "hint", None)
    message = f"{exc} {hint}" if hint else str(exc)
    if isinstance(exc, (errors.ModelNotFoundError, errors.RepoNotFoundError)):
        return APIError(404, message, param="model", code="model_not_found")
    if isinstance(exc, (errors.ModelInUseError, errors.ModelExistsError)):
        return APIError(409, message, param="model")
    if isinstance(exc, errors.InvalidNameError):
        return APIError(400, message, param="model")
    if isinstance(exc, errors.OfflineError):
        return APIError(503, message, code="offline")
    if isinstance(exc, errors.HubError):
        return APIError(502, message, code="hub_error")
    return APIError(500, f"The store failed: {message}")


def _repo_and_revision(name: str) -> tuple[str, str | None]:
    """``org/name:tag`` as the repo id and the revision (None for ``latest``)."""
    base, sep, tag = name.strip().rpartition(":")
    if not sep or "/" in tag:
        return name.strip(), None
    return base, None if tag == LATEST else tag


def _pulled_already(name: str) -> bool:
    from mlx_integrations.models.store import default_store

    try:
        return default_store().contains(name)
    except Exception:
        return False


async def pull(body: wire.PullRequest, request: Request) -> Response:
    """Answer ``POST /api/pull``."""
    from mlx_integrations.models.names import is_repo_id

    accepted = Accepted(request, body)
    repo, revision = _repo_and_revision(body.named)
    if not is_repo_id(repo):
        if revision is None and await asyncio.to_thread(_pulled_already, repo):
            return _done(body.stream, accepted)
        raise APIError(
            400,
            f"{body.named!r} is not a Hugging Face repo id: this server pulls MLX models "
            "from the Hub, named 'org/name' (e.g. mlx-community/SmolLM2-135M-Instruct-8bit; "
            "':tag' names a revision); Ollama's library names are not models here",
            param="model",
        )
    lines = _pulling(repo, revision)
    if not body.stream:
        async for _ in lines:  # errors are raised with their status
            pass
        return json_answer(wire.Progress(status="success"), accepted)
    return ndjson_reply(request, _lines(lines), accepted)


def _done(stream: bool, accepted: Accepted) -> Response:
    success = wire.Progress(status="success")
    if not stream:
        return json_answer(success, accepted)
    body = line(wire.Progress(status="pulling manifest")) + line(success)
    return Response(body, media_type="application/x-ndjson", headers=accepted.headers)


async def _lines(progress: AsyncIterator[wire.Progress]) -> AsyncIterator[bytes]:
    async for item in progress:
        yield line(item)


async def _pulling(repo: str, revision: str | None) -> AsyncIterator[wire.Progress]:
    """The pull's progress, as Ollama reports it; the download runs in a thread.

    Raises:
        APIError: The store's error (404 for an unknown repo, 502 for the Hub...).
    """
    from mlx_integrations.models import pull as store_pull
    from mlx_integrations.models.errors import StoreError

    loop = asyncio.get_running_loop()
    updates: asyncio.Queue[Any] = asyncio.Queue()

    def progress(update: Any) -> None:
        loop.call_soon_threadsafe(updates.put_nowait, update)

    yield wire.Progress(status="pulling manifest")
    task = asyncio.ensure_future(
        asyncio.to_thread(store_pull, repo, revision=revision, progress=progress)
    )
    task.add_done_callback(lambda _: loop.call_soon_threadsafe(updates.put_nowait, None))
    verifying = False
    while True:
        batch = [await updates.get()]
        while not updates.empty():
            batch.append(updates.get_nowait())
        finished = batch[-1] is None
        downloads = [u for u in batch if u is not None and u.task == "bytes"]
        if downloads and downloads[-1].total:
            last = downloads[-1]
            yield wire.Progress(
                status=f"pulling {repo}",
                digest=repo,
                total=int(last.total),
                completed=int(last.completed),
            )
        if not verifying and any(u is not None and u.task == "hash" for u in batch):
            verifying = True
            yield wire.Progress(status="verifying sha256 digest")
        if finished:
            break
    try:
        task.result()
    except StoreError as exc:
        raise store_error(exc) from None
    yield wire.Progress(status="writing manifest")
    yield wire.Progress(status="success")


async def delete(body: wire.DeleteRequest, request: Request) -> Response:
    """Answer ``DELETE /api/delete``: 200 with no body, as Ollama answers."""
    from mlx_integrations.models import remove_model
    from mlx_integrations.models.errors import StoreError

    state: ServerState = request.app.state.server
    name = served_name(body.named)
    if name in {s.name for s in state.registry.served()}:
        with contextlib.suppress(APIError):
            await state.registry.stop(name)  # the server lets go of it first
    try:
        await asyncio.to_thread(remove_model, name)
    except StoreError as exc:
        raise store_error(exc) from None
    return Response(status_code=200)


async def copy(body: wire.CopyRequest, request: Request) -> Response:
    """Answer ``POST /api/copy``: ``destination`` becomes a store alias of ``source``."""
    from mlx_integrations.models import tag_model
    from mlx_integrations.models.errors import StoreError

    source, destination = served_name(body.source), served_name(body.destination)
    if ":" in destination:
        raise APIError(
            400,
            f"'destination' {body.destination!r}: the store names models without tags; "
            f"copy to {destination.replace(':', '-')!r} or "
            f"{destination.rpartition(':')[0] + ':latest'!r}",
            param="destination",
        )
    try:
        await asyncio.to_thread(tag_model, source, destination)
    except StoreError as exc:
        error = store_error(exc)
        error.param = "source" if error.status == 404 else "destination"
        raise error from None
    return Response(status_code=200)


async def create(request: Request) -> Response:
    """Answer ``POST /api/create`` with 501: Modelfiles are Ollama's own."""
    raise APIError(
        501,
        "POST /api/create is not served: it builds Ollama models from Modelfiles and GGUF "
        "layers, which this server does not run. Make a model with the mlxi command "
        "instead (mlxi pull ORG/NAME, mlxi import FILE.gguf NAME, mlxi quantize, "
        "mlxi tag); it is then listed by GET /api/tags",
        code="not_implemented",
    )
