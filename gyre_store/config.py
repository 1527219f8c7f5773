"""Configuration value objects for the store; only entry points read the environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre_store.exceptions import ConfigError
from gyre_store.log import Limits


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long an idempotent append keeps retrying while the database is unreachable."""

    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    give_up_after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """How to reach PostgreSQL and how to append.

    ``copy_threshold``: batches of at least this many events go through binary COPY
    instead of the single-round-trip append function.
    """

    database_url: str
    pool_min_size: int = 1
    pool_max_size: int = 8
    limits: Limits = field(default_factory=Limits)
    copy_threshold: int = 32
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    application_name: str = "gyre"

    def __post_init__(self) -> None:
        if not self.database_url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            raise ConfigError(
                f"database URL must start with postgresql:// (got {self.database_url[:30]!r}...); "
                "set GYRE_DATABASE_URL or leave it unset to use the embedded server"
            )
        if self.pool_min_size < 1 or self.pool_max_size < self.pool_min_size:
            raise ConfigError("pool sizes must satisfy 1 <= pool_min_size <= pool_max_size")
        if self.copy_threshold < 1:
            raise ConfigError("copy_threshold must be at least 1")

    @property
    def psycopg_url(self) -> str:
        """The URL in the form psycopg accepts (without SQLAlchemy's driver suffix)."""
        if self.database_url.startswith("postgresql+psycopg://"):
            return "postgresql://" + self.database_url[len("postgresql+psycopg://") :]
        return self.database_url
