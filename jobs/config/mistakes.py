"""The config check reports every mistake at once, and refuses oversized input first."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.errors import ConfigError
from pipeline.terminal import short
from storage_schema.backend import redact_url, url_has_password

MAX_FILE_BYTES = 1 << 20  # a config file of over 1 MiB is not a config
MAX_VALUES = 20_000  # every mapping, list and scalar counted, aliases as often as they are used
MAX_STRING = 4_096  # the longest path a file system takes
MAX_TEXT = 256 * 1024  # characters of all strings and keys together, well under Prefect's parameter cap
MAX_SHOWN = 50  # mistakes listed; the rest counted


class ConfigMistakes(ConfigError):
    """Several mistakes of one config; ``messages`` holds each one's line."""

    def __init__(self, messages: Iterable[str]):
        self.messages = list(dict.fromkeys(messages))  # once each, in the order found
        super().__init__("\n".join(self.messages))

    def __str__(self) -> str:
        shown = self.messages[:MAX_SHOWN]
        more = len(self.messages) - len(shown)
        return "\n".join(shown + ([f"... and {more} more mistake(s)"] if more > 0 else []))


class Mistakes:
    """Collects the ``ConfigError`` of each check run under :meth:`collect`."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    @contextlib.contextmanager
    def collect(self) -> Iterator[None]:
        """Run a block; a ``ConfigError`` it raises is noted (all its lines) instead of raised."""
        try:
            yield
        except ConfigError as exc:
            self.add(exc)

    def add(self, exc: ConfigError) -> None:
        """Note ``exc``'s message (each message of a :class:`ConfigMistakes`)."""
        self.messages.extend(exc.messages if isinstance(exc, ConfigMistakes) else [str(exc)])

    def raise_any(self) -> None:
        """Raise the mistakes noted so far, if any: one ``ConfigError`` as is, several as one."""
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            raise ConfigMistakes(self.messages)


def check_file_size(path: Any, size: int) -> None:
    """Refuse a config file too large to be one, before reading it."""
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes; a config file holds at most {MAX_FILE_BYTES:,} "
                          "(is this the config?)")


def check_bounds(data: Any, path: str = "config") -> None:
    """Refuse parsed config data over the bounds above, with the path where they ran out."""
    # Containers are sized before they are entered, so an alias bomb costs one ``len``.
    values, text = 0, 0
    stack: list[tuple[str, Any]] = [(path, data)]
    while stack:
        where, value = stack.pop()
        values += 1
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise ConfigError(f"{where}: a string of {len(value):,} characters ({short(value, 40)}); "
                                  f"a config string holds at most {MAX_STRING:,}")
            text += len(value)
        elif isinstance(value, dict):
            _room(where, values + len(stack) + len(value))
            items: list[tuple[str, Any]] = []
            for k, v in value.items():
                key = k if isinstance(k, str) else str(k)
                if len(key) > MAX_STRING:
                    raise ConfigError(f"{where}: a key of {len(key):,} characters ({short(key, 40)}); "
                                      f"at most {MAX_STRING:,}")
                text += len(key)
                items.append((f"{where}.{key}", v))
            stack.extend(items)
        elif isinstance(value, (list, tuple)):
            _room(where, values + len(stack) + len(value))
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        if text > MAX_TEXT:
            raise ConfigError(f"{where}: the config's text passes {MAX_TEXT:,} characters (a YAML alias "
                              f"repeats what it names); a config holds at most {MAX_TEXT:,}")


# Keys of fsspec storage options that hold credentials (s3fs, gcsfs, adlfs, botocore).
_SECRET_OPTIONS = ("key", "access_key", "access_key_id", "account_key", "passwd", "connection_string")


def check_no_credentials(store: str, storage_options: dict[str, Any], path: str) -> None:
    """The config travels to Prefect (flow parameters, kept in its database) and into the
    report: credentials must come from the environment, never from the config."""
    if url_has_password(store):
        raise ConfigError(f"{path}.store: {redact_url(store)!r} carries a password in its URL; remove it "
                          "and give credentials through the environment (for S3: AWS_ACCESS_KEY_ID, "
                          "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")

    def walk(options: Any, where: str) -> None:
        for k, v in (options.items() if isinstance(options, dict) else ()):
            name = str(k).lower().removeprefix("aws_")
            if name in _SECRET_OPTIONS or "secret" in name or "password" in name or name.endswith("token"):
                raise ConfigError(f"{where}.{k}: credentials are not accepted in the config (it is "
                                  "stored with each run); set them in the environment instead (for S3: "
                                  "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)")
            walk(v, f"{where}.{k}")

    walk(storage_options, f"{path}.storage_options")


def _room(where: str, needed: int) -> None:
    if needed > MAX_VALUES:
        raise ConfigError(f"{where}: the config holds more than {MAX_VALUES:,} values (a YAML alias repeats "
                          f"what it names, e.g. a list of lists); a config holds at most {MAX_VALUES:,}")
