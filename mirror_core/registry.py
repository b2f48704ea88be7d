"""A small typed client for the Confluent Schema Registry REST API.

Works against Confluent Schema Registry and against Apicurio Registry's
Confluent-compatible API (``<url>/apis/ccompat/v7``). Every call has a
timeout; connection errors, 5xx answers and 429 (rate limited) are retried with
exponential backoff (tenacity; a 429's ``Retry-After`` is honoured, up to
:data:`RETRY_AFTER_MAX` seconds); and all clients of one registry URL share a
circuit breaker (pybreaker), so a dead registry fails fast instead of costing
``retries x timeout`` per call. Other 4xx answers are the registry speaking:
they are not retried. No 4xx (429 included: the registry is alive) is counted
by the breaker.

Errors are :class:`RegistryError` and keep the HTTP status and the registry's
``error_code``. The basic-auth credentials (``basic.auth.user.info``, or the
``user:password@`` part of the URL, which is taken out of the URL) are handed to
httpx as an auth object only; they never appear in a request URL, an error, a
log line or a ``repr``.
"""

from __future__ import annotations

import email.utils
import json
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx
import pybreaker
from pydantic import SecretStr
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from mirror_core.config import SchemaRegistryConfig
from mirror_core.errors import SchemaMirrorError
from mirror_core.redaction import redact_text, redact_url, reveal

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Registry error codes that all mean "not there / not set": subject, version, schema, subject-level config.
NOT_FOUND_CODES = frozenset({40401, 40402, 40403, 40408})

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

#: the longest wait a 429's ``Retry-After`` gets before the next attempt (a registry asking for more is
#: asked again sooner: an in-flight schema-id miss waits it out up to ``outage_deadline`` anyway)
RETRY_AFTER_MAX = 30.0


# --------------------------------------------------------------------------- values


def tls_context(cfg: SchemaRegistryConfig) -> ssl.SSLContext | bool:
    """The TLS settings of a registry config as an SSL context (True: the system's defaults).

    A file that cannot be read or a key that does not open is one line naming the setting, never the
    password."""
    if cfg.ssl_ca_location is None and cfg.ssl_certificate_location is None:
        return True
    where = f"schema registry {cfg.url.display}"
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_location)
    except (OSError, ssl.SSLError) as exc:
        raise SchemaMirrorError(f"{where}: ssl.ca.location {cfg.ssl_ca_location!r} is not a readable PEM CA "
                                f"bundle ({getattr(exc, 'strerror', None) or exc.__class__.__name__})") from None
    if cfg.ssl_certificate_location and cfg.ssl_key_location:
        password = cfg.ssl_key_password.get_secret_value() if cfg.ssl_key_password else None
        try:
            ctx.load_cert_chain(cfg.ssl_certificate_location, cfg.ssl_key_location, password)
        except (OSError, ssl.SSLError) as exc:
            raise SchemaMirrorError(
                f"{where}: cannot load the client certificate {cfg.ssl_certificate_location!r} with key "
                f"{cfg.ssl_key_location!r}: {getattr(exc, 'strerror', None) or getattr(exc, 'reason', None) or exc}"
                " (wrong ssl.key.password, or key and certificate do not match)") from None
    return ctx



@dataclass(frozen=True)
class SchemaReference:
    """A reference from one schema to a version of another subject (Avro named type, Protobuf import, JSON $ref)."""

    name: str
    subject: str
    version: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class Schema:
    """A schema's content, as returned by ``GET /schemas/ids/{id}``."""

    schema_type: str
    schema_str: str
    references: tuple[SchemaReference, ...] = ()


@dataclass(frozen=True)
class RegisteredSchema:
    """One version of a subject. ``schema_id`` is only meaningful on the registry it came from."""

    subject: str
    version: int
    schema_id: int
    schema_type: str
    schema_str: str
    references: tuple[SchemaReference, ...] = ()
    #: the registry-global GUID (UUID text) of the schema, on registries that report one (Confluent 8+)
    guid: str | None = None

    @property
    def schema(self) -> Schema:
        return Schema(self.schema_type, self.schema_str, self.references)


# --------------------------------------------------------------------------- errors


class RegistryError(SchemaMirrorError):
    """A registry call failed; keeps the HTTP status and the registry's error code when there was an answer.

    ``transient`` is true for connection failures, timeouts, 5xx and 429 answers (the only ones retried;
    all but 429 are counted by the circuit breaker). ``retry_after`` is a 429's ``Retry-After`` in seconds.
    """

    def __init__(
        self,
        message: str,
        *,
        subject: str | None = None,
        http_status: int | None = None,
        error_code: int | None = None,
        transient: bool = False,
        reason: str | None = None,
        retry_after: float | None = None,
        url: str | None = None,
    ):
        self.transient = transient
        self.retry_after = retry_after
        #: the registry's URL without credentials, when the error is about one registry
        self.url = url
        #: for a transport failure, what the HTTP client saw (e.g. ``ConnectError: ... Connection refused``)
        self.reason = reason or message
        super().__init__(message, subject=subject, http_status=http_status, error_code=error_code)


class RegistryUnavailableError(RegistryError):
    """The registry's circuit breaker is open: calls fail immediately until it resets."""


def is_outage(err: BaseException) -> bool:
    """True when the registry could not be reached or could not serve: connection refused, a timeout, a 5xx (or
    429) answer, or its circuit breaker open. A runtime failure, not a problem of what was asked."""
    return isinstance(err, RegistryError) and (err.transient or isinstance(err, RegistryUnavailableError))


def is_not_found(err: BaseException) -> bool:
    """True for the registry's "not found / not set" answers (40401, 40402, 40403, 40408)."""
    return isinstance(err, SchemaMirrorError) and err.error_code in NOT_FOUND_CODES


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` part, and that part as (user, password) or None."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


# --------------------------------------------------------------------------- breakers

_BREAKERS: dict[str, pybreaker.CircuitBreaker] = {}
_BREAKERS_LOCK = threading.Lock()


def _counts_as_failure_exclusion(exc: BaseException) -> bool:
    """pybreaker exclusion: the registry answered (4xx, 429 included), so it is alive."""
    return isinstance(exc, RegistryError) and (not exc.transient or exc.http_status == 429)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header (seconds, or an HTTP date) as seconds from now, at least 0; None when
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def breaker_for(url: str, fail_max: int = 5, reset_timeout: float = 30.0) -> pybreaker.CircuitBreaker:
    """The circuit breaker shared by every client of ``url`` (created with these settings on first use)."""
    key = redact_url(url).rstrip("/")
    with _BREAKERS_LOCK:
        breaker = _BREAKERS.get(key)
        if breaker is None:
            breaker = pybreaker.CircuitBreaker(
                fail_max=fail_max,
                reset_timeout=reset_timeout,
                exclude=[_counts_as_failure_exclusion],
                name=key,
            )
            _BREAKERS[key] = breaker
        return breaker


# --------------------------------------------------------------------------- client


def _parse_refs(raw: Iterable[dict[str, Any]] | None) -> tuple[SchemaReference, ...]:
    return tuple(SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"])) for r in raw or ())


class RegistryClient:
    """Confluent REST API client for one registry.

    Build it with :meth:`from_config`; pass ``http`` to supply your own
    ``httpx.Client`` (tests use that to count attempts). Not thread-safe per
    instance beyond what ``httpx.Client`` offers; the breaker is shared.
    """

    def __init__(
        self,
        url: str | SecretStr,
        *,
        auth: tuple[str, str] | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        breaker: pybreaker.CircuitBreaker | None = None,
        backoff: float = 0.2,
        backoff_max: float = 5.0,
        http: httpx.Client | None = None,
        verify: ssl.SSLContext | bool = True,
        sleep: Callable[[float], None] = time.sleep,
    ):
        # credentials in the URL become basic auth: httpx (and its request logs) never see them
        plain, userinfo = split_userinfo(reveal(url).rstrip("/"))
        self._url = plain
        self._display_url = redact_url(plain)
        auth = auth or userinfo
        self._timeout = timeout
        self._retries = retries
        self._breaker = breaker or breaker_for(self._url)
        self._backoff = backoff
        self._backoff_max = backoff_max
        self._sleep = sleep
        self._http = http or httpx.Client(verify=verify)
        self._owns_http = http is None
        self._auth = httpx.BasicAuth(*auth) if auth else None
        self._id_preservation: bool | None = None

    @classmethod
    def from_config(cls, cfg: SchemaRegistryConfig, *, http: httpx.Client | None = None,
                    backoff: float = 0.2) -> RegistryClient:
        """A client with the config's timeout, retries and (shared, per-URL) circuit breaker."""
        auth: tuple[str, str] | None = None
        if cfg.basic_auth_user_info is not None:
            user, _, password = cfg.basic_auth_user_info.get_secret_value().partition(":")
            auth = (user, password)
        return cls(
            cfg.url,
            auth=auth,
            timeout=cfg.timeout,
            retries=cfg.retries,
            breaker=breaker_for(cfg.url.display, cfg.breaker_failures, cfg.breaker_reset),
            backoff=backoff,
            http=http,
            verify=tls_context(cfg),
        )

    @property
    def url(self) -> str:
        """The registry URL, without credentials."""
        return self._display_url

    @property
    def breaker(self) -> pybreaker.CircuitBreaker:
        return self._breaker

    def __repr__(self) -> str:
        return f"RegistryClient({self._display_url!r})"

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- transport

    def _send(self, method: str, path: str, params: dict[str, Any] | None, body: Any, subject: str | None,
              timeout: float | None = None) -> Any:
        what = f"{method} {path}"
        try:
            resp = self._http.request(
                method,
                self._url + path,
                params=params,
                content=json.dumps(body).encode() if body is not None else None,
                headers={"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE},
                auth=self._auth if self._auth is not None else httpx.USE_CLIENT_DEFAULT,
                timeout=self._timeout if timeout is None else timeout,
            )
        except httpx.TransportError as exc:
            text = str(exc)
            if "CERTIFICATE_VERIFY_FAILED" in text or "WRONG_VERSION_NUMBER" in text:
                reason = ("its TLS certificate is not trusted (set the registry's ssl.ca.location)"
                          if "CERTIFICATE_VERIFY_FAILED" in text else "TLS handshake failed (http vs https?)")
                raise RegistryError(f"schema registry {self._display_url} refused ({what}): {reason}",
                                    subject=subject, url=self._display_url) from None
            why = redact_text(str(exc)).strip()
            raise RegistryError(
                f"schema registry {self._display_url} unreachable ({what}): {type(exc).__name__}"
                + (f" ({why})" if why else ""),
                subject=subject, transient=True, reason=f"{type(exc).__name__}" + (f": {why}" if why else ""),
                url=self._display_url,
            ) from None
        if resp.status_code < 400:
            try:
                return resp.json() if resp.content else None
            except ValueError:
                raise RegistryError(f"schema registry {self._display_url}: {what} answered HTTP "
                                    f"{resp.status_code} with a body that is not JSON (wrong URL?)",
                                    subject=subject, http_status=resp.status_code, url=self._display_url) from None
        code: int | None = None
        message = resp.reason_phrase
        try:
            payload = resp.json()
            if isinstance(payload, dict):
                code = int(payload["error_code"]) if payload.get("error_code") is not None else None
                message = str(payload.get("message") or message)
        except (ValueError, TypeError):
            pass
        limited = resp.status_code == 429
        raise RegistryError(
            f"schema registry {self._display_url}: {what} failed: {message}",
            subject=subject, http_status=resp.status_code, error_code=code,
            transient=resp.status_code >= 500 or limited,
            retry_after=retry_after_seconds(resp.headers.get("Retry-After")) if limited else None,
            url=self._display_url,
        )

    def _call_once(self, method: str, path: str, params: dict[str, Any] | None, body: Any,
                   subject: str | None) -> Any:
        try:
            return self._breaker.call(self._send, method, path, params, body, subject)
        except pybreaker.CircuitBreakerError as exc:
            cause = exc.__cause__
            reason = f" (last failure: {cause})" if isinstance(cause, RegistryError) else ""
            raise RegistryUnavailableError(
                f"schema registry {self._display_url} circuit breaker is open: failing fast{reason}",
                subject=subject, url=self._display_url,
            ) from None

    def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None,
                 subject: str | None = None) -> Any:
        backoff = wait_exponential(multiplier=self._backoff, max=self._backoff_max)

        def wait(rs: RetryCallState) -> float:
            exc = rs.outcome.exception() if rs.outcome is not None else None
            if isinstance(exc, RegistryError) and exc.retry_after is not None:
                return min(exc.retry_after, RETRY_AFTER_MAX)  # the registry said when (429)
            return float(backoff(rs))

        retrying = Retrying(
            stop=stop_after_attempt(self._retries + 1),
            wait=wait,
            retry=retry_if_exception(
                lambda e: isinstance(e, RegistryError) and e.transient and not isinstance(e, RegistryUnavailableError)
            ),
            reraise=True,
            sleep=self._sleep,
            before_sleep=lambda rs: log.debug("retrying %s %s on %s (attempt %d)", method, path,
                                              self._display_url, rs.attempt_number),
        )
        return retrying(self._call_once, method, path, params, body, subject)

    def _maybe(self, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except RegistryError as exc:
            if is_not_found(exc):
                return None
            raise

    def ping(self, timeout: float | None = None) -> None:
        """One ``GET /subjects`` without retries or the circuit breaker: does the registry answer?
        Raises RegistryError (``transient`` when it could not be reached)."""
        self._send("GET", "/subjects", None, None, None, timeout)

    # ----------------------------------------------------------------- subjects and versions

    def subjects(self) -> list[str]:
        """Every (non-deleted) subject. Raises RegistryError."""
        return [str(s) for s in self._request("GET", "/subjects")]

    def versions(self, subject: str) -> list[int]:
        """The subject's version numbers in ascending order; ``[]`` if the subject does not exist."""
        got = self._maybe(lambda: self._request("GET", f"/subjects/{_q(subject)}/versions", subject=subject))
        return sorted(int(v) for v in got or [])

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        """One version of a subject. Raises RegistryError (40401 / 40402 when absent)."""
        raw = self._request("GET", f"/subjects/{_q(subject)}/versions/{version}", subject=subject)
        return self._registered(raw, subject)

    def schema_by_id(self, schema_id: int) -> Schema:
        """The schema with this id on this registry. Raises RegistryError (40403 when unknown)."""
        raw = self._request("GET", f"/schemas/ids/{int(schema_id)}")
        return Schema(str(raw.get("schemaType") or "AVRO"), str(raw["schema"]), _parse_refs(raw.get("references")))

    def schema_by_guid(self, guid: str) -> Schema | None:
        """The schema with this GUID (UUID text), or None when the registry does not know it or has no
        GUID API (Apicurio answers 404 without an error code)."""
        try:
            raw = self._request("GET", f"/schemas/guids/{_q(guid)}")
        except RegistryError as exc:
            if is_not_found(exc) or exc.http_status in (404, 405, 501):
                return None
            raise
        if not isinstance(raw, dict) or "schema" not in raw:
            return None
        return Schema(str(raw.get("schemaType") or "AVRO"), str(raw["schema"]), _parse_refs(raw.get("references")))

    def ids_for_guid(self, guid: str) -> list[int]:
        """The schema ids that have this GUID (``GET /schemas/guids/{guid}/ids``); ``[]`` when unknown or
        when the registry has no such API."""
        try:
            raw = self._request("GET", f"/schemas/guids/{_q(guid)}/ids")
        except RegistryError as exc:
            if is_not_found(exc) or exc.http_status in (404, 405, 501):
                return []
            raise
        out: list[int] = []
        for item in raw if isinstance(raw, list) else []:
            if isinstance(item, dict) and item.get("id") is not None:
                out.append(int(item["id"]))
            elif isinstance(item, int):
                out.append(item)
        return out

    def subject_versions_for_id(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        """``(subject, version)`` pairs that use this schema id (with ``deleted``, soft-deleted versions
        too); ``[]`` if unknown."""
        params = {"deleted": "true"} if deleted else None
        got = self._maybe(lambda: self._request("GET", f"/schemas/ids/{int(schema_id)}/versions", params=params))
        return [(str(r["subject"]), int(r["version"])) for r in got or []]

    def register(
        self,
        subject: str,
        schema_str: str,
        schema_type: str = "AVRO",
        references: Sequence[SchemaReference] = (),
        normalize: bool = False,
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> int:
        """Register a schema under ``subject`` and return its id on this registry.

        Registering a schema the subject already has returns the existing id
        without a new version. ``schema_id`` / ``version`` ask for an explicit
        id and version, which registries honour only in IMPORT mode (check the
        returned id). Raises RegistryError (409 when incompatible, 422 invalid).
        """
        body = self._schema_body(schema_str, schema_type, references)
        if schema_id is not None:
            body["id"] = int(schema_id)
        if version is not None:
            body["version"] = int(version)
        raw = self._request("POST", f"/subjects/{_q(subject)}/versions",
                            params={"normalize": "true"} if normalize else None, body=body, subject=subject)
        return int(raw["id"])

    def lookup(
        self,
        subject: str,
        schema_str: str,
        schema_type: str = "AVRO",
        references: Sequence[SchemaReference] = (),
        normalize: bool = False,
        *,
        deleted: bool = False,
    ) -> RegisteredSchema | None:
        """The subject's version holding this schema, or None if the subject or schema is not there.

        With ``deleted``, soft-deleted versions count too (registries without that option ignore it)."""
        body = self._schema_body(schema_str, schema_type, references)
        params = {k: "true" for k, on in (("normalize", normalize), ("deleted", deleted)) if on}
        raw = self._maybe(lambda: self._request(
            "POST", f"/subjects/{_q(subject)}", params=params or None, body=body, subject=subject,
        ))
        if raw is None:
            return None
        # Apicurio omits schemaType in lookup answers: the type asked about is the type found.
        return self._registered(raw, subject, default_type=schema_type)

    def delete_version(self, subject: str, version: int) -> None:
        """Soft-delete one version (its schema stays readable by id); a version already gone is no error."""
        self._maybe(lambda: self._request("DELETE", f"/subjects/{_q(subject)}/versions/{int(version)}",
                                          subject=subject))

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        """Soft-delete a subject (then hard-delete when ``permanent``); returns the deleted versions."""
        got = self._request("DELETE", f"/subjects/{_q(subject)}", subject=subject)
        if permanent:
            self._maybe(lambda: self._request("DELETE", f"/subjects/{_q(subject)}",
                                              params={"permanent": "true"}, subject=subject))
        return [int(v) for v in got or []]

    # ----------------------------------------------------------------- compatibility

    def subject_compatibility(self, subject: str) -> str | None:
        """The compatibility level set on ``subject``, or None when the subject has none of its own.

        Confluent answers 40401/40408 for "not set". Apicurio instead answers
        200 ``NONE`` for a subject without a level, so a ``NONE`` answer is
        compared with ``?defaultToGlobal=true``: a different answer there means
        "not set". Limitation: when the global level is itself NONE, an unset
        subject cannot be told from one explicitly set to NONE and is reported
        as ``"NONE"`` (the effective level either way).
        """
        path = f"/config/{_q(subject)}"
        raw = self._maybe(lambda: self._request("GET", path, subject=subject))
        level = _level(raw)
        if level != "NONE":
            return level
        effective = _level(self._maybe(lambda: self._request("GET", path, params={"defaultToGlobal": "true"},
                                                             subject=subject)))
        return None if effective not in (None, "NONE") else level

    def global_compatibility(self) -> str:
        """The registry-wide default compatibility level."""
        level = _level(self._request("GET", "/config"))
        return level or "BACKWARD"

    def set_compatibility(self, subject: str | None, level: str) -> None:
        """Set ``level`` on ``subject`` (or globally when None). Raises RegistryError (42203 invalid level)."""
        path = "/config" if subject is None else f"/config/{_q(subject)}"
        self._request("PUT", path, body={"compatibility": level.upper()}, subject=subject)

    # ----------------------------------------------------------------- mode

    def mode(self, subject: str | None = None) -> str:
        """READWRITE, READONLY or IMPORT, for the subject (falling back to global) or the registry."""
        path = "/mode" if subject is None else f"/mode/{_q(subject)}"
        raw = self._maybe(lambda: self._request("GET", path, params={"defaultToGlobal": "true"} if subject else None,
                                                subject=subject))
        if raw is None and subject is not None:
            return self.mode()
        return str((raw or {}).get("mode") or "READWRITE")

    def set_mode(self, mode: str, subject: str | None = None, force: bool = False) -> None:
        """Set the mode (IMPORT needs ``force`` on a non-empty subject in Confluent)."""
        path = "/mode" if subject is None else f"/mode/{_q(subject)}"
        self._request("PUT", path, params={"force": "true"} if force else None, body={"mode": mode.upper()},
                      subject=subject)

    def probe_id_preservation(self) -> bool:
        """Whether this registry keeps the ids given in IMPORT mode (cached after the first probe).

        Registers a unique throw-away schema with an explicit, unused id under a
        scratch subject in IMPORT mode, checks the id it got back, and deletes
        the scratch subject. Apicurio Registry accepts IMPORT mode but assigns
        its own ids, so this returns False there. Raises RegistryError only when
        the registry is unreachable.
        """
        if self._id_preservation is not None:
            return self._id_preservation
        token = uuid.uuid4().hex
        subject = f"_mirrorflow-id-probe-{token[:12]}"
        wanted = 1_000_000_000 + int(token[:8], 16) % 1_000_000_000
        schema = json.dumps({"type": "record", "name": f"Probe_{token[:12]}", "namespace": "mirrorflow.probe",
                             "fields": []})
        honoured = False
        try:
            self.set_mode("IMPORT", subject, force=True)
            got = self.register(subject, schema, "AVRO", schema_id=wanted, version=1)
            honoured = got == wanted
        except RegistryError as exc:
            if exc.transient:
                raise
            log.info("registry %s rejected the IMPORT-mode probe: %s", self._display_url, exc)
        finally:
            for cleanup in (lambda: self.delete_subject(subject, permanent=True),
                            lambda: self._request("DELETE", f"/mode/{_q(subject)}", subject=subject)):
                try:
                    cleanup()
                except RegistryError:
                    pass
        self._id_preservation = honoured
        return honoured

    # ----------------------------------------------------------------- helpers

    @staticmethod
    def _schema_body(schema_str: str, schema_type: str, references: Sequence[SchemaReference]) -> dict[str, Any]:
        body: dict[str, Any] = {"schema": schema_str}
        if schema_type.upper() != "AVRO":
            body["schemaType"] = schema_type.upper()
        if references:
            body["references"] = [r.as_json() for r in references]
        return body

    @staticmethod
    def _registered(raw: dict[str, Any], subject: str, default_type: str = "AVRO") -> RegisteredSchema:
        return RegisteredSchema(
            subject=str(raw.get("subject") or subject),
            version=int(raw["version"]),
            schema_id=int(raw["id"]),
            schema_type=str(raw.get("schemaType") or default_type).upper(),
            schema_str=str(raw["schema"]),
            references=_parse_refs(raw.get("references")),
            guid=str(raw["guid"]) if raw.get("guid") else None,
        )


def _q(subject: str) -> str:
    return quote(subject, safe="")


def _level(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return None
    level = raw.get("compatibilityLevel") or raw.get("compatibility")
    return str(level).upper() if level else None
