"""Which image and video sources a request may name: local files, hosts, addresses.

In-process callers (the adapters, ``mlxi run``) pass their own files and URLs, so the
default :class:`MediaPolicy` lets every source through. A server answers requests from
others: there a source may name a file of the server's machine or a host of its
private network, which the sender must not reach through the model. A restricted policy
(:meth:`MediaPolicy.restricted`, what ``mlxi serve`` uses) refuses local paths unless
they lie under one allowed folder (symlinks resolved), refuses ``http(s)`` URLs whose
host resolves to a loopback, private, link-local or otherwise special address, and may
keep downloads to a list of domains. The address a download actually connects to (and
each redirect) is checked too, so a name that resolves differently a second time
cannot slip through.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.chat.fields import RequestError

__all__ = ["MediaError", "MediaPolicy"]


class MediaError(RequestError):
    """An image or video source that cannot be used, with what to do about it (a
    :class:`~mlx_integrations.chat.fields.RequestError` at ``messages`` unless a path
    is given)."""

    def __init__(self, message: str, path: str = "messages") -> None:
        super().__init__(message, path)


def _describe(source: Any) -> str:
    text = str(source)
    return repr(text if len(text) <= 80 else f"{text[:40]}...{text[-24:]}")


@dataclass(frozen=True)
class MediaPolicy:
    """Where images and videos may come from.

    The default lets every source through (the caller's own files and URLs).

    Args:
        allow_local_files: Local paths and ``file://`` URLs may be read.
        allowed_local_path: When set, local files are read only from under this folder
            (the path is resolved, symlinks included, before it is compared), whatever
            ``allow_local_files`` says.
        allow_private_urls: ``http(s)`` URLs may reach loopback, private, link-local,
            multicast, reserved and unspecified addresses.
        allowed_domains: When set, ``http(s)`` URLs may name only these hosts (exact
            names, compared without case); None allows any host.

    Examples:
        >>> from mlx_integrations.engine.vision.policy import MediaPolicy
        >>> policy = MediaPolicy.restricted(allowed_local_path="/srv/images")
        >>> policy.allow_private_urls
        False
        >>> # SimpleEngine(model, media_policy=policy), or
        >>> # ChatMLX(model=..., engine_options={"media_policy": policy})
    """

    allow_local_files: bool = True
    allowed_local_path: str | None = None
    allow_private_urls: bool = True
    allowed_domains: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        path = self.allowed_local_path
        if path is not None:
            if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
                raise TypeError(f"allowed_local_path must be a folder path, got {path!r}")
            resolved = Path(path).expanduser().resolve()
            if not resolved.is_dir():
                raise ValueError(
                    f"allowed_local_path={str(path)!r} is not a folder; give the folder "
                    "whose images requests may name"
                )
            object.__setattr__(self, "allowed_local_path", str(resolved))
        domains = self.allowed_domains
        if domains is not None:
            if isinstance(domains, str) or not isinstance(domains, Iterable):
                raise TypeError(f"allowed_domains must be a list of host names, got {domains!r}")
            cleaned = tuple(str(d).strip().lower().rstrip(".") for d in domains)
            if not all(cleaned):
                raise ValueError(f"allowed_domains holds an empty host name: {domains!r}")
            object.__setattr__(self, "allowed_domains", cleaned)

    @classmethod
    def restricted(
        cls,
        *,
        allowed_local_path: str | os.PathLike[str] | None = None,
        allowed_domains: Iterable[str] | None = None,
        allow_private_urls: bool = False,
    ) -> MediaPolicy:
        """The policy of a server: no local files but under ``allowed_local_path``, no
        private addresses unless ``allow_private_urls``, only ``allowed_domains`` if given.
        """
        return cls(
            allow_local_files=False,
            allowed_local_path=None if allowed_local_path is None else str(allowed_local_path),
            allow_private_urls=allow_private_urls,
            allowed_domains=None if allowed_domains is None else tuple(allowed_domains),
        )

    @property
    def unrestricted(self) -> bool:
        """Every source is let through (the default policy)."""
        return (
            self.allow_local_files
            and self.allowed_local_path is None
            and self.allow_private_urls
            and self.allowed_domains is None
        )

    @property
    def restricts_files(self) -> bool:
        """Local paths are checked (refused, or kept to one folder)."""
        return not self.allow_local_files or self.allowed_local_path is not None

    # ------------------------------------------------------------------ checks

    def check_local(self, path: Path) -> Path:
        """The path to read for a local source, or :class:`MediaError`.

        The answer does not depend on whether the file exists, so a refused path
        tells the sender nothing about the files of this machine.
        """
        if not self.restricts_files:
            return path
        if self.allowed_local_path is None:
            raise MediaError(
                f"local file {_describe(path)} is refused: this server reads no local "
                "files; send the image as a data: URL or base64 data (or start the "
                "server with --allowed-local-media-path DIR)"
            )
        root = Path(self.allowed_local_path)
        resolved = path.expanduser().resolve()  # symlinks followed before comparing
        if not resolved.is_relative_to(root):
            raise MediaError(
                f"local file {_describe(path)} is refused: it is not under the allowed "
                f"folder {str(root)!r} (symlinks resolved); move it there or send it as "
                "a data: URL"
            )
        return resolved

    def check_url(self, url: str) -> None:
        """Refuse an ``http(s)`` URL whose host is not allowed, or resolves to a
        private address (every address the name resolves to is checked)."""
        if self.allow_private_urls and self.allowed_domains is None:
            return
        parsed = urllib.parse.urlsplit(url)
        host = (parsed.hostname or "").lower().rstrip(".")
        if not host:
            raise MediaError(f"{_describe(url)} names no host")
        if self.allowed_domains is not None and host not in self.allowed_domains:
            raise MediaError(
                f"{_describe(url)} is refused: the host {host!r} is not among the allowed "
                f"media domains ({', '.join(self.allowed_domains)}); send the image as a "
                "data: URL, or add the host with --allowed-media-domains"
            )
        if self.allow_private_urls:
            return
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            self.check_address(str(literal), url)
            return
        try:
            infos = socket.getaddrinfo(host, parsed.port or 80, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise MediaError(
                f"{_describe(url)} could not be fetched: its host {host!r} does not resolve ({exc})"
            ) from None
        for info in infos:
            self.check_address(str(info[4][0]), url)

    def check_address(self, address: str, url: str) -> None:
        """Refuse a connection to a special address (loopback, private, link-local...)
        unless ``allow_private_urls``."""
        if self.allow_private_urls:
            return
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            raise MediaError(f"{_describe(url)} resolves to {address!r}, no IP address") from None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not ip.is_global or ip.is_multicast:
            raise MediaError(
                f"{_describe(url)} is refused: it reaches {ip}, a loopback, private, "
                "link-local or reserved address, which this server does not fetch from; "
                "send the image as a data: URL (or start the server with "
                "--allow-private-media-urls)"
            )
