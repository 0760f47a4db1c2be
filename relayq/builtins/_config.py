"""Which builtin tools a toolkit gets, and the limits they run under."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from relayq._errors import ToolkitError

__all__ = ["BASH_ENV_NAMES", "BUILTIN_NAMES", "BuiltinsConfig"]

BUILTIN_NAMES: tuple[str, ...] = (
    "bash",
    "read",
    "write",
    "edit",
    "grep",
    "glob",
    "webfetch",
    "question",
    "apply_patch",
    "todowrite",
)

BASH_ENV_NAMES: frozenset[str] = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR"}
)
"""The worker's variables a bash command sees by default, with every `LC_*` one."""


@dataclass(frozen=True, kw_only=True)
class BuiltinsConfig:
    """The builtins to enable (all by default) and the limits they run under.

    BuiltinsConfig(
        bash_pass_env=frozenset({"GOPATH"}),
        bash_env={"CI": "1"},
        webfetch_allowed_networks=("10.20.0.0/16",),
    )
    """

    enabled: frozenset[str] = field(default_factory=lambda: frozenset(BUILTIN_NAMES))
    """Names of the enabled builtins."""
    bash_timeout: timedelta = timedelta(seconds=120)
    """A command still running after this is killed with every process it started."""
    bash_pass_env: frozenset[str] = frozenset()
    """More of the worker's environment variables that bash commands see.

    A command sees only `BASH_ENV_NAMES` and `LC_*` of the worker's environment
    (provider keys and other secrets stay out), plus these names and `bash_env`.
    """
    bash_env: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Variables set for every bash command, over any the worker has."""
    file_timeout: timedelta = timedelta(seconds=30)
    """read, grep and glob give up after this long; so does a runaway grep pattern."""
    webfetch_timeout: timedelta = timedelta(seconds=30)
    """A fetch, redirects included, gives up after this long."""
    webfetch_allowed_networks: tuple[str, ...] = ()
    """Networks webfetch may reach although they are not public, e.g. `"10.0.0.0/8"`.

    By default loopback, private, link-local, multicast, reserved and other
    non-global addresses are refused, after DNS resolution and on every redirect.
    `("0.0.0.0/0", "::/0")` allows every address.
    """
    max_output_chars: int = 50_000
    """Longer tool output is cut, with a note saying so."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.enabled) - set(BUILTIN_NAMES))
        if unknown:
            raise ToolkitError(
                f"unknown builtin(s) {', '.join(unknown)}; the builtins are "
                f"{', '.join(BUILTIN_NAMES)}"
            )
        names = frozenset(self.bash_pass_env)
        env = dict(self.bash_env)
        for name in sorted(names | set(env)):
            if not name or "=" in name or "\0" in name:
                raise ToolkitError(f"invalid environment variable name {name!r}")
        if any("\0" in value for value in env.values()):
            raise ToolkitError("bash_env values must not contain NUL bytes")
        for net in self.webfetch_allowed_networks:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError as exc:
                raise ToolkitError(f"webfetch_allowed_networks: {exc}") from exc
        # Copies, so that changing the caller's dict or set later changes nothing here
        # (plain types: a config may be pickled or deep-copied with its agent).
        object.__setattr__(self, "bash_pass_env", names)
        object.__setattr__(self, "bash_env", env)
        object.__setattr__(self, "webfetch_allowed_networks", tuple(self.webfetch_allowed_networks))

    @classmethod
    def off(cls) -> BuiltinsConfig:
        """No builtins at all."""
        return cls(enabled=frozenset())

    @classmethod
    def only(cls, *names: str) -> BuiltinsConfig:
        """Just the named builtins."""
        return cls(enabled=frozenset(names))
