"""Whether the Hugging Face Hub (or the mirror ``HF_ENDPOINT`` names) answers, for
``mlxi doctor``: one short request, none in offline mode."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from mlx_integrations.models.hub.pull import hub_endpoint, hub_offline

DEFAULT_ENDPOINT = "https://huggingface.co"

HubStatus = Literal["reachable", "unreachable", "offline"]


@dataclass(frozen=True)
class HubCheck:
    """What one request to the Hub's endpoint found.

    Attributes:
        endpoint: The URL asked (``HF_ENDPOINT``, else huggingface.co).
        status: ``reachable`` (it answered over HTTP), ``unreachable`` (no answer, or a
            server error), or ``offline`` (``HF_HUB_OFFLINE`` is set: nothing was asked).
        http_status: The HTTP status of the answer, when there was one.
        seconds: How long the answer took, when there was one.
        error: Why it is unreachable.
    """

    endpoint: str
    status: HubStatus
    http_status: int | None = None
    seconds: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for ``mlxi doctor --json``."""
        return asdict(self)


def check_hub(endpoint: str | None = None, *, timeout: float = 3.0) -> HubCheck:
    """Ask the Hub's endpoint for its front page once (HEAD, no redirects, no token).

    Any HTTP answer below 500 counts as reachable: the request went through DNS, the
    proxy and TLS as a download would.

    Args:
        endpoint: The Hub URL (default: ``HF_ENDPOINT`` read now, else huggingface.co).
        timeout: Seconds to wait for a connection and for the answer.

    Examples:
        >>> check_hub().status  # doctest: +SKIP
        'reachable'
    """
    url = (hub_endpoint(endpoint) or DEFAULT_ENDPOINT).rstrip("/")
    if hub_offline():
        return HubCheck(url, "offline")
    import httpx
    from huggingface_hub.utils import get_session

    start = time.perf_counter()
    try:
        answer = get_session().head(url + "/", timeout=timeout, follow_redirects=False)
    except httpx.TimeoutException:
        return HubCheck(url, "unreachable", error=f"no answer within {timeout:g} s")
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        return HubCheck(url, "unreachable", error=str(exc) or type(exc).__name__)
    seconds = round(time.perf_counter() - start, 3)
    if answer.status_code >= 500:
        error = f"the server answered HTTP {answer.status_code}"
        return HubCheck(url, "unreachable", answer.status_code, seconds, error)
    return HubCheck(url, "reachable", answer.status_code, seconds)
