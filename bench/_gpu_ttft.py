"""bench_gpu.py's time to first token on prompts new to the process, and what a GPU's
per-shape set-up costs.

MLX's CUDA backend sets up work for each new shape it meets (cuDNN attention graphs,
CUDA graphs) and keeps it per thread, so the time to a first token depends on whether
the thread has seen that prompt length. Three figures, per length class:

- **cold**: a prompt whose length (and content) no earlier request of the process had,
  on either side; raw ``mlx_lm.stream_generate`` against ``SimpleEngine`` with the
  device's defaults (``prefill_buckets`` and ``warmup_shapes`` on with CUDA).
- **repeat**: the next prompt of each side, new content of the same length as its cold
  one (what a second prompt of one length costs).
- **new thread**: raw again at its cold length, on a thread of its own: cold if the
  set-up is kept per thread, as fast as repeat if per process.

Each side first answers one short prompt (its own length), so the figures leave out
what the first request of a process or an engine thread costs (reported apart). The
sides alternate, the first one rotating each repetition.
"""

from __future__ import annotations

import asyncio
import copy
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _gpu_owners import probed_engine, retire

SYLLABLES = "ka lo mi ne su ta ri po ve za du fe gi ho ju".split()


class Prompts:
    """New prompts: fresh words, and a token count no earlier prompt had."""

    def __init__(self, tokenizer: Any, seed: int = 7):
        self._tokenizer = tokenizer
        self._random = random.Random(seed)
        self.seen: set[int] = set()

    def _words(self, n: int) -> list[str]:
        pick = self._random.choice
        return ["".join(pick(SYLLABLES) for _ in range(1 + len(self.seen) % 3)) for _ in range(n)]

    def new(self, target: int, length: int | None = None) -> tuple[str, list[int]]:
        """A prompt of fresh words: about ``target`` tokens, of a token count no earlier
        prompt had; or, given ``length``, exactly that many (a count seen before)."""
        encode = self._tokenizer.encode
        want = length or target
        for _ in range(50):
            words = self._words(max(1, want // 2))
            while len(encode(" ".join(words))) < want:
                words += self._words(max(1, (want - len(encode(" ".join(words)))) // 2))
            while len(words) > 1 and len(encode(" ".join(words[:-1]))) >= want:
                words.pop()
            text = " ".join(words)
            if length is None:
                while len(encode(text)) in self.seen:
                    text += " " + self._words(1)[0]
                self.seen.add(len(encode(text)))
                return text, encode(text)
            if len(encode(text)) == length:
                return text, encode(text)
        raise RuntimeError(f"no prompt of exactly {length} tokens")


def _raw_ttft(model: Any, tokenizer: Any, ids: list[int]) -> float:
    from mlx_lm import stream_generate

    start = time.perf_counter()
    for _ in stream_generate(model, tokenizer, ids, max_tokens=2):
        return time.perf_counter() - start
    raise RuntimeError("no token")


def _raw_ttft_new_thread(model: Any, tokenizer: Any, ids: list[int]) -> float:
    """``_raw_ttft`` on a thread of its own (its MLX streams released at its end)."""
    from mlx_integrations.runtime.owner import release_thread_streams

    out: list[Any] = []

    def run() -> None:
        try:
            out.append(_raw_ttft(model, tokenizer, ids))
        except BaseException as exc:  # reported by the caller
            out.append(exc)
        finally:
            release_thread_streams()

    thread = threading.Thread(target=run, name="bench-new-thread")
    thread.start()
    thread.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return float(out[0])


async def _ours_ttft(engine: Any, text: str) -> float:
    start = time.perf_counter()
    async for _ in engine.stream_generate(text, max_tokens=2, temperature=0.0):
        return time.perf_counter() - start
    raise RuntimeError("no token")


def _ratios(ours: list[float], raw: list[float]) -> dict[str, Any]:
    ratios = [o / r for o, r in zip(ours, raw, strict=True) if r > 0]
    return {
        "ours_median": statistics.median(ours),
        "raw_median": statistics.median(raw),
        "ratio": statistics.median(ratios),
        "ratio_low": min(ratios),
        "ratio_high": max(ratios),
    }


def _summary(
    rows: dict[int, dict[str, list[Any]]],
    engines: list[str],
    variants: dict[str, Any],
    unpadded: bool,
) -> dict[str, Any]:
    """Each length class's timings and ratios (cold and repeat), from ``rows``."""
    lengths: dict[str, Any] = {}
    for target, row in rows.items():
        entry: dict[str, Any] = dict(row)
        for name in engines:
            suffix = "" if name == "ours" else f"_{name.removeprefix('ours_')}"
            for kind in ("cold", "repeat"):
                mine = [r[kind] for r in row[name]]
                entry[kind + suffix] = _ratios(mine, [r[kind] for r in row["raw"]])
        for name in variants:  # each against the default engine, side by side
            for kind in ("cold", "repeat"):
                entry[f"{kind}_{name}_vs_default"] = _ratios(
                    [r[kind] for r in row[f"ours_{name}"]], [r[kind] for r in row["ours"]]
                )
        if unpadded:  # padded against unpadded, both ours
            for kind in ("cold", "repeat"):
                entry[f"{kind}_padded_vs_unpadded"] = _ratios(
                    [r[kind] for r in row["ours"]], [r[kind] for r in row["ours_unpadded"]]
                )
        entry["raw_new_thread_median"] = statistics.median(r["ttft"] for r in row["raw_new_thread"])
        lengths[str(target)] = entry
    return lengths


def bench_ttft(
    path: Path,
    model: Any,
    tokenizer: Any,
    lengths: list[int],
    reps: int,
    engine_options: dict[str, Any],
    card: str,
    unpadded: bool = True,
    variants: dict[str, dict[str, Any]] | None = None,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Cold, repeat and new-thread time to first token per length class (see the module).

    ``unpadded`` adds a third side: the engine with ``prefill_buckets`` and
    ``warmup_shapes`` off, on an owner thread of its own, interleaved with the others.
    ``variants`` ({name: options}) add more: ``ours_NAME``, the engine with
    ``engine_options`` and these, the warm-up probes among them
    (``_gpu_owners.probed_engine``). ``save`` is given the results so far after each
    repetition (``reps_done``): a part stopped by its deadline keeps them.
    """
    from mlx_lm import stream_generate

    from mlx_integrations.engine import SimpleEngine

    prompts = Prompts(tokenizer)
    options = {"cache_memory_mb": 0} | engine_options
    plain_options = options | {"prefill_buckets": False, "warmup_shapes": False}
    engines = {"ours": SimpleEngine(path, **options)}
    if unpadded:
        engines["ours_unpadded"] = SimpleEngine(path, **plain_options)
    for name, extra in (variants or {}).items():
        if not name.isalnum() or name == "unpadded":  # its keys would meet others'
            raise ValueError(
                f"ttft variant name {name!r}: use letters and digits, other than 'unpadded'"
            )
        engines[f"ours_{name}"] = probed_engine(SimpleEngine, path, options | extra)
    loop = asyncio.new_event_loop()
    out: dict[str, Any] = {"card": card, "engine_options": options, "reps": reps, "lengths": {}}
    out["variants"] = variants or {}
    for name, engine in engines.items():
        began = time.perf_counter()
        loop.run_until_complete(engine.start())
        out[name] = {
            "prefill_buckets": list(engine._shapes.buckets),
            "load_s": time.perf_counter() - began,
            "warmup_s": engine.warmup_seconds,
        }
    out |= {k: out["ours"][k] for k in ("prefill_buckets", "load_s", "warmup_s")}
    names = ["raw", *engines]
    try:
        # The first request of each side (process and engine-thread set-up), apart.
        first = {"raw": _raw_ttft(model, tokenizer, prompts.new(9)[1])}
        for name, engine in engines.items():
            first[name] = loop.run_until_complete(_ours_ttft(engine, prompts.new(9)[0]))
        out["first_request"] = first
        rows: dict[int, dict[str, list[Any]]] = {
            L: {name: [] for name in [*names, "raw_new_thread"]} for L in lengths
        }
        for rep in range(reps):
            sides = names[rep % len(names) :] + names[: rep % len(names)]
            for target in lengths:
                for side in sides:
                    text, ids = prompts.new(target)
                    again, again_ids = prompts.new(target, length=len(ids))
                    if side == "raw":
                        cold = _raw_ttft(model, tokenizer, ids)
                        repeat = _raw_ttft(model, tokenizer, again_ids)
                        _, third_ids = prompts.new(target, length=len(ids))
                        rows[target]["raw_new_thread"].append(
                            {
                                "tokens": len(third_ids),
                                "ttft": _raw_ttft_new_thread(model, tokenizer, third_ids),
                            }
                        )
                    else:
                        cold = loop.run_until_complete(_ours_ttft(engines[side], text))
                        repeat = loop.run_until_complete(_ours_ttft(engines[side], again))
                    rows[target][side].append(
                        {"tokens": len(ids), "cold": cold, "repeat": repeat, "rep": rep}
                    )
            out["lengths"] = _summary(rows, list(engines), out["variants"], unpadded)
            out["reps_done"] = rep + 1
            if save is not None:  # a part stopped by its deadline keeps what it finished
                save(copy.deepcopy(out))
        out["distinct_lengths"] = len(prompts.seen)
        # After the timing: the greedy replies of every side to the same new prompts
        # (padded prefill pieces must not change them).
        same = []
        for target in lengths:
            text, ids = prompts.new(target)
            raw = [int(r.token) for r in stream_generate(model, tokenizer, ids, max_tokens=16)]
            row = {"tokens": len(ids)}
            for name, engine in engines.items():
                reply = loop.run_until_complete(engine.generate(text, max_tokens=16, temperature=0))
                row[name] = list(reply.tokens) == raw
            row["same"] = all(v for k, v in row.items() if k != "tokens")
            same.append(row)
        out["same_greedy_tokens"] = same
    finally:
        for engine in engines.values():
            retire(engine, loop)
        loop.close()
    return out


def brief_ttft(r: dict[str, Any]) -> str:
    """One line for the log: cold and repeat ratios per length class."""
    cells = []
    for target, row in r.get("lengths", {}).items():
        cold, repeat = row["cold"], row["repeat"]
        cell = (
            f"{target}: cold {cold['ratio']:.2f} ({cold['ours_median'] * 1e3:.0f}/"
            f"{cold['raw_median'] * 1e3:.0f} ms), repeat {repeat['ratio']:.2f} "
            f"({repeat['ours_median'] * 1e3:.0f}/{repeat['raw_median'] * 1e3:.0f} ms), raw on a "
            f"new thread {row['raw_new_thread_median'] * 1e3:.0f} ms"
        )
        if "cold_unpadded" in row:
            plain = row["cold_unpadded"]
            cell += (
                f", unpadded engine cold {plain['ratio']:.2f} ({plain['ours_median'] * 1e3:.0f} "
                f"ms; padded/unpadded {row['cold_padded_vs_unpadded']['ratio']:.2f})"
            )
        for name in r.get("variants", {}):
            cell += f", {name}_vs_default cold {row[f'cold_{name}_vs_default']['ratio']:.2f}"
        cells.append(cell)
    if "same_greedy_tokens" in r:  # checked once the timing is done
        same = r["same_greedy_tokens"]
        cells.append(f"same greedy tokens {sum(x['same'] for x in same)}/{len(same)}")
    warm = r.get("warmup_s")
    head = f"[{r.get('card')}] load {r.get('load_s', 0):.2f} s" + (
        f" (warm-up {warm:.2f} s)" if warm is not None else " (no warm-up)"
    )
    return head + "; " + "; ".join(cells)
