"""A size and structure budget for what a checkpoint's pickle builds besides tensors.

A pickle is a program: a few KB can build a dict that holds itself twenty times, or a list
of lists of lists whose ``repr`` is gigabytes (sharing costs nothing to store, everything
to walk). Before torch unpickles a file, its pickle opcodes are replayed here on
stand-ins: nothing is built, no global is looked up, and every length is checked before
its bytes are read, so the replay costs at most a few MB whatever the file. Refused with a
:class:`~pipeline.errors.CheckpointError` naming the file and the budget that ran out:

- :data:`MAX_PICKLE_BYTES` bytes of pickle (tensor bytes are not in it);
- :data:`MAX_OPS` opcodes (each value created is at least one);
- :data:`MAX_VALUES` values counted as often as they are referenced (what walking the
  result costs: ``[[x] * 200] * 200`` is 40,000 values), and :data:`MAX_TEXT` characters
  of strings and bytes counted the same way;
- :data:`MAX_SHARED` shared references (memo gets: a tied weight, a repeated key);
- :data:`MAX_DEPTH` levels of nesting;
- :data:`MAX_STRING` bytes in one string or bytes value, :data:`MAX_INT_BYTES` in one integer;
- no value that holds itself or is changed after it was shared (Python's pickler writes
  that only for a value inside itself, which no state dict or training record needs).
"""

from __future__ import annotations

import io
import pickletools
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO

from pipeline.errors import CheckpointError

MAX_PICKLE_BYTES = 256 << 20
MAX_OPS = 5_000_000
MAX_VALUES = 2_000_000
MAX_TEXT = 256 << 20
MAX_SHARED = 1_000_000
MAX_DEPTH = 100
MAX_STRING = 16 << 20
MAX_INT_BYTES = 64
_LEGACY_PICKLES = 5  # a legacy torch.save: magic number, protocol, sys info, the object, storage keys

_OPS = {op.code.encode("latin-1"): op for op in pickletools.opcodes}
_LENGTH_PREFIX = {pickletools.TAKEN_FROM_ARGUMENT1: ("<B", 1), pickletools.TAKEN_FROM_ARGUMENT4: ("<i", 4),
                  pickletools.TAKEN_FROM_ARGUMENT4U: ("<I", 4), pickletools.TAKEN_FROM_ARGUMENT8U: ("<Q", 8)}
_TEXT_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
             "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_INT_OPS = {"LONG", "LONG1", "LONG4"}
_MEMO_INDEX = {"BINGET": "<B", "LONG_BINGET": "<I", "BINPUT": "<B", "LONG_BINPUT": "<I"}
_PUSH_NEW = {"EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET", "EMPTY_TUPLE", "NONE", "NEWTRUE", "NEWFALSE", "INT",
             "BININT", "BININT1", "BININT2", "FLOAT", "BINFLOAT", "GLOBAL", "PERSID", "EXT1", "EXT2", "EXT4",
             "NEXT_BUFFER"} | _TEXT_OPS | _INT_OPS
_COLLECT = {"LIST", "TUPLE", "DICT", "FROZENSET", "OBJ", "INST"}  # pop to mark, push one
_FILL_FROM_MARK = {"APPENDS", "SETITEMS", "ADDITEMS"}  # pop to mark, into the value below it
_COMBINE = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "REDUCE": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3, "STACK_GLOBAL": 2,
            "BINPERSID": 1}


class _Value:
    """A stand-in: how many values and characters it stands for, its depth, whether shared."""

    __slots__ = ("values", "text", "depth", "shared")

    def __init__(self, values: int = 1, text: int = 0, depth: int = 0) -> None:
        self.values, self.text, self.depth, self.shared = values, text, depth, False


_MARK = object()


class _Replay:
    """One pickle replayed on stand-ins; :meth:`run` raises at the first budget passed."""

    def __init__(self, stream: BinaryIO, size: int, name: str) -> None:
        self.f, self.left, self.name = stream, size, name
        self.stack: list[object] = []
        self.memo: dict[int, _Value] = {}
        self.ops = self.shared = self.marks = 0

    def refuse(self, what: str, limit: int | None = None) -> None:
        bound = f" (at most {limit:,})" if limit is not None else ""
        raise CheckpointError(f"Refusing checkpoint {self.name!r}: {what}{bound}; a checkpoint's values besides "
                              "its tensors are bounded (see the README's security section)")

    def read(self, n: int) -> bytes:
        if n > self.left:
            raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (it ends "
                                  f"{n - self.left:,} bytes early)")
        data = self.f.read(n)
        if len(data) < n:
            raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (truncated)")
        self.left -= n
        return data

    def line(self) -> bytes:
        data = self.f.readline(min(self.left, 4096) + 1)
        if not data.endswith(b"\n"):
            raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (a line too long "
                                  "or cut short)")
        self.left -= len(data)
        return data[:-1]

    def pop(self) -> _Value:
        if not self.stack or self.stack[-1] is _MARK:
            raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (stack underflow)")
        return self.stack.pop()  # type: ignore[return-value]

    def pop_mark(self) -> list[_Value]:
        items: list[_Value] = []
        while self.stack and self.stack[-1] is not _MARK:
            items.append(self.stack.pop())  # type: ignore[arg-type]
        if not self.stack:
            raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (no mark)")
        self.stack.pop()
        self.marks -= 1
        return items

    def made(self, items: list[_Value], text: int = 0) -> _Value:
        value = _Value(1 + sum(i.values for i in items), text + sum(i.text for i in items),
                       1 + max(i.depth for i in items) if items else 0)
        self.check(value)
        return value

    def fill(self, target: _Value, items: list[_Value]) -> None:
        if target.shared:
            self.refuse("a value that holds itself or is changed after it is shared")
        target.values += sum(i.values for i in items)
        target.text += sum(i.text for i in items)
        target.depth = max([target.depth] + [i.depth + 1 for i in items])
        self.check(target)

    def check(self, value: _Value) -> None:
        if value.values > MAX_VALUES:
            self.refuse(f"{value.values:,} values counted as often as they are referenced", MAX_VALUES)
        if value.text > MAX_TEXT:
            self.refuse(f"{value.text:,} characters of text counted as often as referenced", MAX_TEXT)
        if value.depth > MAX_DEPTH:
            self.refuse(f"values nested {value.depth} levels deep", MAX_DEPTH)

    def argument(self, op: pickletools.OpcodeInfo) -> tuple[int | None, int]:
        """(the integer argument where one is needed, the text length) of ``op``; reads its bytes."""
        arg = op.arg
        if arg is None:
            return None, 0
        if arg.n in _LENGTH_PREFIX:
            fmt, width = _LENGTH_PREFIX[arg.n]
            n = struct.unpack(fmt, self.read(width))[0]
            limit = MAX_INT_BYTES if op.name in _INT_OPS else MAX_STRING
            if n < 0 or n > limit:
                self.refuse(f"a {'number' if op.name in _INT_OPS else 'string'} of {n:,} bytes", limit)
            self.skip(n)
            return None, n
        if arg.n == pickletools.UP_TO_NEWLINE:
            data = self.line()
            if op.name == "LONG" and len(data) > MAX_INT_BYTES:
                self.refuse(f"a number of {len(data):,} digits", MAX_INT_BYTES)
            if op.name in ("GET", "PUT"):
                try:
                    return int(data), 0
                except ValueError:
                    raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (bad memo "
                                          "index)") from None
            if arg.name == "stringnl_noescape_pair":
                self.line()  # GLOBAL, INST: module, then name
            return None, len(data)
        data = self.read(arg.n)
        if op.name in _MEMO_INDEX:
            return struct.unpack(_MEMO_INDEX[op.name], data)[0], 0
        return None, 0

    def skip(self, n: int) -> None:
        while n:
            n -= len(self.read(min(n, 1 << 20)))

    def run(self) -> None:
        while True:
            code = self.read(1)
            op = _OPS.get(code)
            if op is None:
                raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (invalid load key "
                                      f"{code!r})")
            self.ops += 1
            if self.ops > MAX_OPS:
                self.refuse(f"more than {MAX_OPS:,} pickle operations", MAX_OPS)
            index, text = self.argument(op)
            if self.step(op.name, index, text):
                return

    def step(self, name: str, index: int | None, text: int) -> bool:  # noqa: C901  one branch per opcode kind
        stack = self.stack
        if name == "STOP":
            return True
        if name in _PUSH_NEW:
            stack.append(self.made([], text))
        elif name == "MARK":
            stack.append(_MARK)
            self.marks += 1
            if self.marks > MAX_DEPTH:
                self.refuse(f"values nested more than {MAX_DEPTH} levels deep", MAX_DEPTH)
        elif name in _COLLECT:
            items = self.pop_mark()
            if name == "INST":
                items.append(self.made([]))
            stack.append(self.made(items))
        elif name in _COMBINE:
            items = [self.pop() for _ in range(_COMBINE[name])]
            stack.append(self.made(items))
        elif name in ("APPEND", "SETITEM", "BUILD"):
            items = [self.pop() for _ in range(2 if name == "SETITEM" else 1)]
            self.fill(self.pop_target(), items)
        elif name in _FILL_FROM_MARK:
            items = self.pop_mark()
            self.fill(self.pop_target(), items)
        elif name == "POP":
            if stack and stack[-1] is _MARK:
                stack.pop()
                self.marks -= 1
            else:
                self.pop()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name in ("DUP", "GET", "BINGET", "LONG_BINGET"):
            value = self.pop() if name == "DUP" else self.memo.get(index)  # type: ignore[arg-type]
            if value is None:
                raise CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle (memo {index} "
                                      "not found)")
            self.shared += 1
            if self.shared > MAX_SHARED:
                self.refuse(f"more than {MAX_SHARED:,} shared references", MAX_SHARED)
            value.shared = True
            stack.extend([value, value] if name == "DUP" else [value])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            value = self.pop()
            stack.append(value)
            self.memo[len(self.memo) if name == "MEMOIZE" else index] = value  # type: ignore[index]
        # PROTO, FRAME, READONLY_BUFFER: no value
        return False

    def pop_target(self) -> _Value:
        target = self.pop()
        self.stack.append(target)
        return target


def _replay(stream: BinaryIO, size: int, name: str, pickles: int = 1) -> None:
    """Replay up to ``pickles`` pickles one after another from ``stream`` (``size`` bytes left)."""
    if size > MAX_PICKLE_BYTES and pickles == 1:
        raise CheckpointError(f"Refusing checkpoint {name!r}: a pickle of {size:,} bytes (at most "
                              f"{MAX_PICKLE_BYTES:,}); a checkpoint's values besides its tensors are bounded")
    for _ in range(pickles):
        if size <= 0:
            return  # a plain pickle, not torch.save's sequence: torch says so
        replay = _Replay(stream, min(size, MAX_PICKLE_BYTES), name)
        replay.run()
        size -= min(size, MAX_PICKLE_BYTES) - replay.left


def check_pickle_budget(path: str | Path, kind: str) -> None:
    """Refuse a PyTorch file (``kind`` as ``container_format`` tells it) whose pickle passes a budget.

    Parameters
    ----------
    path : str or Path
        The checkpoint file.
    kind : str
        ``torch-zip`` or ``pickle``.

    Raises
    ------
    CheckpointError
        Naming the file and the budget passed, or what is damaged.
    """
    path = Path(path)
    name = path.name
    if kind == "torch-zip":
        with zipfile.ZipFile(path) as archive:
            infos = [i for i in archive.infolist() if i.filename.endswith("data.pkl")]
            for info in infos[:1]:
                if info.file_size > MAX_PICKLE_BYTES:
                    _replay(io.BytesIO(), info.file_size, name)  # refused by its size
                with archive.open(info) as member:
                    _replay(io.BytesIO(member.read(info.file_size)), info.file_size, name)
    elif kind == "pickle":
        with open(path, "rb") as f:
            _replay(f, path.stat().st_size, name, pickles=_LEGACY_PICKLES)
