"""Keeping secrets out of everything a person or a log can read.

* :class:`SecretUrl` holds a URL that may carry credentials (``https://user:password@host/...``): its
  ``str``/``repr`` (and pydantic's dumps) show the URL without the ``user:password@`` part, and only
  :meth:`SecretUrl.get_secret_value` returns it whole. Configs hold registry URLs as this type.
* :func:`redact_url` / :func:`redact_text` drop URL userinfo from one URL / from free text (log lines,
  error messages, tracebacks).
* :func:`is_secret_key` / :func:`redact_config` tell which client properties are secrets and give a copy
  of a librdkafka-style config that is safe to print (for reprs of values that carry client configs).
* :class:`ClientConfig` holds a whole client configuration: a dict to the client it is handed to,
  shown redacted by ``repr``/``str`` (settings objects that carry one print safely).
* :class:`RedactingFormatter` is the last line of defence for logs: whatever a library puts in a log
  line or a traceback, URL userinfo never reaches the output.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

#: Kafka / registry client and Spark / Hadoop property names whose values are secrets: passwords and
#: passphrases (librdkafka's ``sasl.oauthbearer.assertion.private.key.passphrase``, Spark's ``spark.ssl.keyPassword``),
#: secrets and tokens, JAAS / OAUTHBEARER / basic-auth lines, inline private keys (librdkafka ``ssl.key.pem`` and
#: ``sasl.oauthbearer.assertion.private.key.pem``, Java ``ssl.keystore.key``) and keys named ``*.key`` (Hadoop's
#: ``fs.s3a.secret.key`` / ``access.key`` / ``encryption.key``, ``fs.azure.account.key.<account>``). Paths to
#: such files (``*.location``, ``*.file``) are not secrets
SECRET_KEY_RE = re.compile(
    r"(password|passphrase|secret|token|sasl\.jaas\.config|sasl\.oauthbearer\.config|basic\.auth\.user\.info"
    r"|key\.pem$|\.key$|account\.key\.)", re.I)

#: ``scheme://userinfo@`` anywhere in a text (``scheme//`` too, a common typo): the userinfo runs to the LAST
#: ``@`` before a blank. An unencoded ``@``, ``'``, ``"``, ``/``, ``?`` or ``#`` in a password is still the
#: password's: a URL parser would end the authority at the ``/``, and show the rest of the password as a path.
#: A URL whose path holds an ``@`` loses its host and path up to it too (shown less, never more)
_USERINFO_IN_TEXT = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*:?//)\S*@")

MASK = "**********"


def redact_url(url: str) -> str:
    """``url`` without its ``user:password@`` part (the rest unchanged). A value without ``scheme://`` (a
    typo, a missing scheme) loses everything up to its last ``@``: its userinfo cannot be told apart."""
    if "//" not in url:
        return url.rpartition("@")[2]
    return _USERINFO_IN_TEXT.sub(r"\g<scheme>", url, count=1)


#: what :func:`url_host` shows: a host name or address, and a port
_HOST_PORT = re.compile(r"^(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::\d+)?$")


def url_host(url: str) -> str | None:
    """The ``host[:port]`` of a URL (well formed or not) for an error message, or None when what stands
    there does not look like one (it may then be part of a password): never any userinfo."""
    rest = url.split("//", 1)[1] if "//" in url else url
    host = re.split(r"[/?#\s]", rest.rpartition("@")[2], maxsplit=1)[0]
    return host if _HOST_PORT.match(host) else None


def redact_text(text: str) -> str:
    """``text`` with the userinfo of every URL in it removed."""
    return _USERINFO_IN_TEXT.sub(r"\g<scheme>", text)


def is_secret_key(name: str) -> bool:
    """True for property names whose values are secrets (passwords, JAAS configs, tokens...)."""
    return bool(SECRET_KEY_RE.search(name))


def redact_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client config that is safe to print: secret values masked, URLs without userinfo."""
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if is_secret_key(key):
            out[key] = MASK
        elif isinstance(value, str):
            out[key] = redact_text(value)
        else:
            out[key] = value
    return out


class ClientConfig(dict[str, Any]):
    """A whole Kafka client configuration (librdkafka or Java properties) that may hold secrets.

    To a client it is the plain dict it expects (confluent-kafka copies it as it is); to anything that
    prints it -- ``repr``/``str``, so a log line, an exception message, or the repr of a settings object
    that holds one -- it shows :func:`redact_config`'s copy: secret values masked, URL userinfo removed.
    Read-only, so a revealed copy never hides inside one; ``conf | extra`` gives a new ``ClientConfig``.
    Pickles as itself (Spark ships settings that hold one to executors).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ClientConfig({redact_config(self)!r})"

    __str__ = __repr__

    def __or__(self, other: Mapping[str, Any]) -> ClientConfig:  # type: ignore[override]
        return ClientConfig({**self, **other})

    def __ror__(self, other: Mapping[str, Any]) -> ClientConfig:  # type: ignore[override,misc]
        return ClientConfig({**other, **self})

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClientConfig, (dict(self),))

    def __copy__(self) -> ClientConfig:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ClientConfig:
        return self

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a ClientConfig is read-only: build a new one with conf | {...}")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]


def client_config(conf: Mapping[str, Any]) -> ClientConfig:
    """``conf`` as a :class:`ClientConfig` (itself when it already is one)."""
    return conf if isinstance(conf, ClientConfig) else ClientConfig(conf)


class SecretUrl(SecretStr):
    """A URL that may carry credentials: shown (``str``, ``repr``, pydantic dumps) without them.

    Works as a pydantic field type like ``SecretStr``; :meth:`get_secret_value` is the full URL for
    the one place that connects with it. Two ``SecretUrl`` are equal when their full URLs are.
    """

    def _display(self) -> str:
        return redact_url(self.get_secret_value())

    @property
    def display(self) -> str:
        """The URL without credentials (same as ``str(self)``)."""
        return self._display()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, SecretUrl) and self.get_secret_value() == other.get_secret_value()

    def __hash__(self) -> int:
        return hash(self.get_secret_value())


def reveal(value: str | SecretStr) -> str:
    """The plain value of a ``str`` or a pydantic secret (for the code that hands it to a client)."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


class RedactingFormatter(logging.Formatter):
    """A formatter whose output never contains URL userinfo, whatever the message or traceback holds."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))
