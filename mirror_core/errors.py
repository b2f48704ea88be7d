"""One exception root for mirrorflow, with a subclass per area.

Every error carries enough context for one clear line on the CLI: a config
error names its YAML path, a Kafka or registry error keeps its code. Messages
never contain secret values (callers pass names, not values).
"""

from __future__ import annotations

from dataclasses import dataclass


class MirrorError(Exception):
    """Root of every error mirrorflow raises on purpose."""

    #: process exit code the CLI uses for this error (2 = bad input, 1 = runtime failure)
    exit_code: int = 1


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a configuration file, located by its YAML path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(MirrorError):
    """The configuration is invalid; holds every issue found, each with its path."""

    exit_code = 2

    def __init__(self, issues: list[ConfigIssue] | ConfigIssue, source: str | None = None):
        self.issues = [issues] if isinstance(issues, ConfigIssue) else list(issues)
        self.source = source
        super().__init__("\n".join(str(i) for i in self.issues))


class LocalClusterError(MirrorError):
    """The embedded local clusters could not be fetched, started or stopped."""


class PrerequisiteError(LocalClusterError):
    """A tool the embedded clusters need (java, mvn) is missing, or a port is taken."""

    exit_code = 2


class KafkaOperationError(MirrorError):
    """A Kafka admin or client operation failed; keeps the broker's error code name."""

    def __init__(self, message: str, code: str | None = None):
        self.code = code
        super().__init__(f"{message} ({code})" if code else message)


class PlanError(MirrorError):
    """A plan cannot be carried out as configured (e.g. replication factor above broker count)."""

    exit_code = 2


class SchemaMirrorError(MirrorError):
    """A schema subject cannot be mirrored (conflict, registry failure)."""

    def __init__(
        self,
        message: str,
        *,
        subject: str | None = None,
        http_status: int | None = None,
        error_code: int | None = None,
    ):
        self.subject = subject
        self.http_status = http_status
        self.error_code = error_code
        detail = []
        if subject:
            detail.append(f"subject {subject!r}")
        if http_status is not None:
            detail.append(f"HTTP {http_status}")
        if error_code is not None:
            detail.append(f"error code {error_code}")
        suffix = f" [{', '.join(detail)}]" if detail else ""
        super().__init__(message + suffix)


class UnreachableError(MirrorError):
    """A Kafka cluster or schema registry a command needs did not answer within the connect timeout.

    The message names each one (cluster alias and bootstrap servers, or registry URL without
    credentials) and what the client saw.
    """


class AccessDeniedError(KafkaOperationError):
    """A cluster refused the configured principal: authentication failed, TLS was not trusted, or an
    ACL is missing. The message names the cluster, the principal and what was refused."""
