"""What ``mlxi serve`` serves and how: the server's settings and each model's engine.

A :class:`ServeConfig` comes from the command line, the environment (``MLXI_HOST``,
``MLXI_PORT``, ``MLXI_API_KEY``...) and an optional file (TOML or JSON) that sets the
engine of each model::

    keep_alive = "10m"          # default for every model (5m when unset)
    max_memory = "8GB"          # memory budget of all models together (LRU eviction)
    engine_type = "batched"     # default kind of engine

    [engine_options]            # default engine options (EngineOptions fields)
    cache_memory_mb = 512

    [models.smol]               # requests name the model "smol"
    model = "smollm2-135m"      # a store alias, pulled Hub id or folder (default: the name)
    engine_type = "simple"
    prompt_lookup = 4           # any EngineOptions field
    keep_alive = -1             # stays loaded
    preload = true              # loaded when the server starts

Models named on the command line are preloaded; a request may name any other model
the store or the Hugging Face cache holds (unless ``only_listed``), which loads on
first use with the default engine.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.pool import ENGINE_CLASSES
from mlx_integrations.engine.vision.policy import MediaPolicy
from mlx_integrations.runtime.memory import parse_keep_alive, parse_memory_size

__all__ = [
    "DEFAULT_KEEP_ALIVE",
    "ModelConfig",
    "ServeConfig",
    "apply_memory_budget",
    "load_config_file",
    "restore_memory_budget",
]

DEFAULT_KEEP_ALIVE = "5m"
"""How long a served model stays loaded after its last request, unless told."""

_ENGINE_FIELDS = {f.name for f in fields(EngineOptions)}
# Engine options a request's sender must not pick through the server's configuration.
_SERVER_ONLY = {"media_policy"}
SERVER_MAX_NUM_SEQS = 32
"""Requests a served ``BatchedEngine`` decodes together unless told otherwise: more than
the engine's own default (8), as a server's clients arrive together (at 32 clients of a
small model, the first tokens came four times sooner and the replies ran 1.3x faster
than with 8)."""
_MODEL_KEYS = {"model", "engine_type", "keep_alive", "preload", "kind", "engine_options"}


@dataclass
class ModelConfig:
    """One model the server knows by name.

    Attributes:
        name: What requests call it (the ``model`` field).
        source: A store alias, pulled Hub id or folder; None means ``name`` itself.
        engine_type: ``"simple"``, ``"batched"`` or ``"distributed"``; None picks the
            default for the model (batched, simple for vision models).
        options: Engine options (``EngineOptions`` fields) over the server's defaults.
        keep_alive: Seconds or a duration the model stays loaded once idle (0 unloads
            after each request, -1 keeps it); None takes the server's default.
        preload: Loaded when the server starts rather than at the first request.
        kind: ``"chat"``, ``"embedding"`` or ``"reranker"`` (a cross-encoder); None
            tells them apart from the folder.
    """

    name: str
    source: str | None = None
    engine_type: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    keep_alive: float | str | None = None
    preload: bool = False
    kind: str | None = None

    @property
    def target(self) -> str:
        """What the model is loaded from."""
        return self.source or self.name

    def check(self) -> None:
        """Refuse an unknown engine kind, option or keep-alive, naming the model.

        Raises:
            ValueError, TypeError: Saying which model and which setting.
        """
        where = f"model {self.name!r}"
        if self.engine_type is not None and self.engine_type not in ENGINE_CLASSES:
            raise ValueError(
                f"{where}: engine_type must be one of {', '.join(ENGINE_CLASSES)}, "
                f"got {self.engine_type!r}"
            )
        if self.kind not in (None, "chat", "embedding", "reranker"):
            raise ValueError(
                f"{where}: kind must be 'chat', 'embedding' or 'reranker', got {self.kind!r}"
            )
        check_engine_options(self.options, where)
        if self.keep_alive is not None:
            parse_keep_alive(self.keep_alive)


def check_engine_options(options: Mapping[str, Any], where: str) -> None:
    """Check engine options as the engines will, before any model loads."""
    unknown = sorted(set(options) - _ENGINE_FIELDS - {"max_num_seqs"})
    if unknown:
        raise ValueError(
            f"{where}: unknown engine option(s) {unknown}; the options are: "
            f"{', '.join(sorted(_ENGINE_FIELDS - _SERVER_ONLY))}, max_num_seqs"
        )
    given = {k: v for k, v in options.items() if k != "max_num_seqs"}
    try:
        EngineOptions(**given)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


@dataclass
class ServeConfig:
    """Settings of one ``mlxi serve`` process.

    Attributes:
        host: Address to bind; 127.0.0.1 (this machine only) by default.
        port: TCP port.
        api_key: When set, every request but ``GET /health`` must carry it
            (``Authorization: Bearer KEY`` or ``x-api-key: KEY``).
        models: Models known by name (preloaded ones load at start).
        engine_type: Default kind of engine; None: batched (simple for vision models).
        engine_options: Default engine options of every model.
        keep_alive: Default keep-alive of served models.
        max_memory: Memory budget of every model of the process together (``"8GB"``,
            ``"0.6"`` of the device's memory, ``"off"``): the least recently used idle
            models are unloaded to make room, and a model that cannot fit is refused
            (507). None leaves the process's budget (``MLXI_MAX_MEMORY``) as it is.
        only_listed: Refuse requests for models not in ``models``.
        max_body_mb: Largest request body; larger ones get 413.
        max_concurrent_requests: Requests in flight at once; more get 429 with
            Retry-After. None: no limit here (the engines queue them).
        default_max_tokens: Tokens of a reply whose request sets no limit; None: up to
            the model's context window.
        allowed_local_media_path: Images may name local files under this folder only;
            None: no local files.
        allowed_media_domains: Hosts images may be downloaded from; None: any public host.
        allow_private_media_urls: Let image URLs reach loopback and private addresses.
        shutdown_timeout_s: On SIGTERM, how long replies in flight may take to finish;
            those still running then end with their API's closing event (at once on
            Ctrl-C).
        stream_keepalive_s: A streamed reply's headers go out once the prompt is
            counted, or after this many seconds at the latest; then, whenever nothing
            was sent for this long (a long prompt being processed), a keep-alive: an
            SSE comment, or Anthropic's ``ping`` event.
        responses_store_size: Responses (``/v1/responses`` with ``store``) kept in
            memory for ``previous_response_id`` and ``GET /v1/responses/{id}``; the
            oldest go first. 0 keeps none.
        responses_ttl: How long a kept response stays: seconds or a duration
            (``"1h"``, ``"30m"``); -1 until newer ones push it out.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    models: list[ModelConfig] = field(default_factory=list)
    engine_type: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    keep_alive: float | str = DEFAULT_KEEP_ALIVE
    max_memory: str | int | None = None
    only_listed: bool = False
    max_body_mb: float = 32.0
    max_concurrent_requests: int | None = None
    default_max_tokens: int | None = None
    allowed_local_media_path: str | None = None
    allowed_media_domains: list[str] | None = None
    allow_private_media_urls: bool = False
    shutdown_timeout_s: float = 30.0
    stream_keepalive_s: float = 10.0
    responses_store_size: int = 1000
    responses_ttl: float | str = "1h"

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0 to 65535, got {self.port!r}")
        if self.engine_type is not None and self.engine_type not in ENGINE_CLASSES:
            raise ValueError(
                f"engine_type must be one of {', '.join(ENGINE_CLASSES)}, got {self.engine_type!r}"
            )
        check_engine_options(self.engine_options, "engine_options")
        parse_keep_alive(self.keep_alive)
        parse_memory_size(self.max_memory, "max_memory")
        for name, value, low in (
            ("max_body_mb", self.max_body_mb, 0.0),
            ("shutdown_timeout_s", self.shutdown_timeout_s, -1.0),
            ("stream_keepalive_s", self.stream_keepalive_s, 0.0),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= low:
                raise ValueError(f"{name} must be a finite number > {max(low, 0):g}, got {value}")
        size = self.responses_store_size
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"responses_store_size must be an integer, got {size!r}")
        if size < 0:
            raise ValueError(f"responses_store_size must be >= 0 (0 keeps none), got {size}")
        _ = self.responses_ttl_s
        for name, number in (
            ("max_concurrent_requests", self.max_concurrent_requests),
            ("default_max_tokens", self.default_max_tokens),
        ):
            if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
                raise TypeError(f"{name} must be an integer, got {number!r}")
            if number is not None and number < 1:
                raise ValueError(f"{name} must be >= 1, got {number}")
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"models named twice: {', '.join(duplicates)}; name each once")
        for model in self.models:
            model.check()
        _ = self.media_policy  # a bad folder or domain list fails here, not at a request

    @property
    def responses_ttl_s(self) -> float:
        """``responses_ttl`` in seconds (``math.inf``: no expiry).

        Raises:
            ValueError, TypeError: Not a duration, or 0.
        """
        fix = "give seconds (3600), a duration ('1h', '30m') or -1 for no expiry"
        try:
            seconds = parse_keep_alive(self.responses_ttl, "responses_ttl")
        except (TypeError, ValueError):
            raise ValueError(
                f"responses_ttl must be a duration, got {self.responses_ttl!r}; {fix}"
            ) from None
        if seconds == 0:
            raise ValueError(f"responses_ttl must be longer than 0; {fix}")
        return seconds

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def media_policy(self) -> MediaPolicy:
        """What image and video sources requests may name."""
        return MediaPolicy.restricted(
            allowed_local_path=self.allowed_local_media_path,
            allowed_domains=self.allowed_media_domains,
            allow_private_urls=self.allow_private_media_urls,
        )

    def model(self, name: str) -> ModelConfig | None:
        """The configured model of that name, if any."""
        return next((m for m in self.models if m.name == name), None)

    def for_ranks(self, ranks: int) -> ServeConfig:
        """These settings on rank 0 of ``mlxi launch`` over ``ranks`` ranks: the one
        model named to preload is sharded over them (a ``DistributedEngine``), and no
        other model is served, since the other ranks follow that one model.

        Raises:
            ValueError: No model or several named to preload, or one given another
                engine type.
        """
        preloaded = [m for m in self.models if m.preload]
        if len(preloaded) != 1:
            named = ", ".join(m.name for m in preloaded) or "none"
            raise ValueError(
                f"under mlxi launch, mlxi serve shards one model over the {ranks} ranks; "
                f"name exactly one (named: {named}): mlxi launch -n {ranks} -- mlxi serve MODEL"
            )
        [model] = preloaded
        if model.engine_type not in (None, "distributed"):
            raise ValueError(
                f"model {model.name!r}: engine_type {model.engine_type!r} cannot run under "
                "mlxi launch, whose other ranks follow a distributed engine; leave "
                "engine_type out or give 'distributed'"
            )
        sharded = replace(model, engine_type="distributed", keep_alive=-1)
        return replace(self, models=[sharded], only_listed=True)

    def with_file(self, path: str | os.PathLike[str]) -> ServeConfig:
        """These settings with a config file's defaults and models joined in: what
        this config sets (the command line) wins, its models come first."""
        data = load_config_file(path)
        models = {m.name: m for m in data.pop("models")}
        for model in self.models:
            models[model.name] = _merge_model(models.get(model.name), model)
        data["models"] = list(models.values())
        return ServeConfig(
            **{**data, **_set_fields(self, exclude={"models"}), "models": data["models"]}
        )


def apply_memory_budget(config: ServeConfig) -> tuple[bool, int | None]:
    """Set the process's memory budget to ``config.max_memory`` when it gives one.

    Returns:
        Whether it was set, and the budget before (to put back).
    """
    if config.max_memory is None:
        return False, None
    from mlx_integrations.engine import pool

    before = pool.memory_budget()
    pool.set_memory_budget(config.max_memory)
    return True, before


def restore_memory_budget(applied: tuple[bool, int | None]) -> None:
    """Put back the budget :func:`apply_memory_budget` replaced (given what it returned)."""
    changed, before = applied
    if changed:
        from mlx_integrations.engine import pool

        pool.set_memory_budget(before)


def _merge_model(base: ModelConfig | None, over: ModelConfig) -> ModelConfig:
    if base is None:
        return over
    return ModelConfig(
        name=over.name,
        source=over.source or base.source,
        engine_type=over.engine_type or base.engine_type,
        options={**base.options, **over.options},
        keep_alive=over.keep_alive if over.keep_alive is not None else base.keep_alive,
        preload=over.preload or base.preload,
        kind=over.kind or base.kind,
    )


def _set_fields(config: ServeConfig, exclude: set[str]) -> dict[str, Any]:
    """The fields of ``config`` that differ from the defaults."""
    default = ServeConfig()
    return {
        f.name: getattr(config, f.name)
        for f in fields(ServeConfig)
        if f.name not in exclude and getattr(config, f.name) != getattr(default, f.name)
    }


_TOP_KEYS = {
    "host",
    "port",
    "engine_type",
    "engine_options",
    "keep_alive",
    "max_memory",
    "only_listed",
    "max_body_mb",
    "max_concurrent_requests",
    "default_max_tokens",
    "allowed_local_media_path",
    "allowed_media_domains",
    "allow_private_media_urls",
    "shutdown_timeout_s",
    "stream_keepalive_s",
    "responses_store_size",
    "responses_ttl",
    "models",
}


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML or JSON config file into :class:`ServeConfig` keywords.

    The API key is not read from files (use ``--api-key`` or ``MLXI_API_KEY``), so
    that a config file can be shared.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not TOML/JSON, an unknown key, or a bad model table (named).
    """
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {str(file)!r} does not exist") from None
    try:
        data = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if file.suffix == ".json" else "TOML"
        raise ValueError(f"config file {str(file)!r} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(file)!r} must hold a table of settings")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        hint = " (give the API key with --api-key or MLXI_API_KEY)" if "api_key" in unknown else ""
        raise ValueError(
            f"config file {str(file)!r} has unknown key(s) {unknown}{hint}; known: "
            f"{', '.join(sorted(_TOP_KEYS))}"
        )
    tables = data.pop("models", {}) or {}
    if not isinstance(tables, dict):
        raise ValueError(f"config file {str(file)!r}: 'models' must be a table of model tables")
    data["models"] = [_model_from_table(name, table, file) for name, table in tables.items()]
    return data


def _model_from_table(name: str, table: Any, file: Path) -> ModelConfig:
    where = f"config file {str(file)!r}, model {name!r}"
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table of settings")
    table = dict(table)
    options = dict(table.pop("engine_options", {}) or {})
    for key in list(table):
        if key not in _MODEL_KEYS:
            options[key] = table.pop(key)  # an engine option given directly
    return ModelConfig(
        name=name,
        source=table.get("model"),
        engine_type=table.get("engine_type"),
        options=options,
        keep_alive=table.get("keep_alive"),
        preload=bool(table.get("preload", False)),
        kind=table.get("kind"),
    )


def models_from_names(names: Sequence[str]) -> list[ModelConfig]:
    """Models named on the command line: each preloaded, under the name given."""
    return [ModelConfig(name=n, preload=True) for n in dict.fromkeys(names)]
