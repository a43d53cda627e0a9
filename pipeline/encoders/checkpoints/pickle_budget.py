"""A size and structure budget for what a checkpoint's pickle builds besides tensors."""

from __future__ import annotations

import mmap
import pickletools
import struct
import zipfile
from pathlib import Path

from pipeline.encoders.checkpoints.storage_sizes import Global, check_storage_sizes, declared_storage
from pipeline.errors import CheckpointError

MAX_PICKLE_BYTES = 256 << 20
MAX_OPS = 2_000_000
MAX_VALUES = 2_000_000
MAX_TEXT = 256 << 20
MAX_SHARED = 1_000_000
MAX_DEPTH = 100
MAX_STRING = 16 << 20
MAX_INT_BYTES = 64
_LEGACY_PICKLES = 5  # a legacy torch.save: magic number, protocol, sys info, the object, storage keys
_LINE = 4096  # the longest argument line (a global's module or name, a protocol-0 number)


_UNKNOWN = object()  # a stand-in's value, where none is kept


class _Value:
    """A stand-in: how many values and characters it stands for, its depth, whether shared
    (a memo get or DUP handed it out again), whether it can take items (a leaf cannot), and
    for the parts of a storage's persistent id (a number, a short string, a global, a short
    tuple of those) the value itself."""

    __slots__ = ("values", "text", "depth", "shared", "leaf", "payload")

    def __init__(self, values: int = 1, text: int = 0, depth: int = 0, leaf: bool = False,
                 payload: object = _UNKNOWN) -> None:
        self.values, self.text, self.depth, self.shared, self.leaf = values, text, depth, False, leaf
        self.payload = payload


_MARK = None  # a mark on the stack
_LEAF = _Value(leaf=True)  # every scalar without text: one stand-in, never changed

# what each opcode does, by kind
(_SCALAR, _TEXT, _EMPTY, _MARK_OP, _COLLECT, _COMBINE, _FILL, _FILL_MARK, _POP, _POP_MARK, _DUP, _GET, _PUT,
 _MEMOIZE, _NONE, _STOP) = range(16)
_KINDS = {
    _SCALAR: "INT BININT BININT1 BININT2 NONE NEWTRUE NEWFALSE FLOAT BINFLOAT GLOBAL PERSID EXT1 EXT2 EXT4 "
             "NEXT_BUFFER LONG LONG1 LONG4",
    _TEXT: "STRING BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8 UNICODE BINUNICODE "
           "SHORT_BINUNICODE BINUNICODE8",
    _EMPTY: "EMPTY_DICT EMPTY_LIST EMPTY_SET EMPTY_TUPLE", _MARK_OP: "MARK",
    _COLLECT: "LIST TUPLE DICT FROZENSET OBJ INST",  # pop to the mark, push one
    _COMBINE: "TUPLE1 TUPLE2 TUPLE3 REDUCE NEWOBJ NEWOBJ_EX STACK_GLOBAL BINPERSID",  # pop n, push one
    _FILL: "APPEND SETITEM BUILD", _FILL_MARK: "APPENDS SETITEMS ADDITEMS",  # into the value below
    _POP: "POP", _POP_MARK: "POP_MARK", _DUP: "DUP", _GET: "GET BINGET LONG_BINGET",
    _PUT: "PUT BINPUT LONG_BINPUT", _MEMOIZE: "MEMOIZE", _STOP: "STOP", _NONE: "PROTO FRAME READONLY_BUFFER",
}
_POPPED = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "REDUCE": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3, "STACK_GLOBAL": 2,
           "BINPERSID": 1, "APPEND": 1, "SETITEM": 2, "BUILD": 1}
_LENGTH = {pickletools.TAKEN_FROM_ARGUMENT1: ("<B", 1), pickletools.TAKEN_FROM_ARGUMENT4: ("<i", 4),
           pickletools.TAKEN_FROM_ARGUMENT4U: ("<I", 4), pickletools.TAKEN_FROM_ARGUMENT8U: ("<Q", 8)}
_INDEX = {"BINGET": "<B", "LONG_BINGET": "<I", "BINPUT": "<B", "LONG_BINPUT": "<I"}
# the values kept (what a storage's persistent id is made of); strings only this short
_BININTS = {"BININT1": "<B", "BININT2": "<H", "BININT": "<i"}
_KEPT = {"INT", "LONG", "LONG1", "LONG4", "GLOBAL", *_BININTS, "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
         "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "UNICODE"}
_KEPT_TEXT = 256
_TUPLES = {"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"}
_KEPT_ITEMS = 6


def _table() -> list[tuple | None]:
    """Per opcode byte: (name, kind, items popped, argument size or kind, length or index format,
    argument lines, whether its argument is an integer's bytes)."""
    kinds = {name: kind for kind, names in _KINDS.items() for name in names.split()}
    table: list[tuple | None] = [None] * 256
    for op in pickletools.opcodes:
        arg = op.arg
        n = 0 if arg is None else arg.n
        lines = 2 if arg is not None and arg.name == "stringnl_noescape_pair" else 1
        fmt = _LENGTH.get(n) or _INDEX.get(op.name)
        is_int = op.name in ("LONG1", "LONG4")
        table[ord(op.code)] = (op.name, kinds[op.name], _POPPED.get(op.name, 0), n, fmt, lines, is_int)
    return table


_TABLE = _table()


class _Replay:
    """Pickles replayed on stand-ins from a buffer; :meth:`run` raises at the first budget passed."""

    def __init__(self, buf: bytes | mmap.mmap, end: int, name: str) -> None:
        self.buf, self.pos, self.end, self.name = buf, 0, end, name
        self.storages: dict[object, int] = {}  # storage key -> bytes declared (the first declaration: torch's)
        self.globals: set[Global] | None = set()  # every global named; None once one could not be told

    def refuse(self, what: str, limit: int) -> None:
        raise CheckpointError(f"Refusing checkpoint {self.name!r}: {what} (at most {limit:,}); a checkpoint's "
                              "values besides its tensors are bounded (see docs/reliability.md, security)")

    def damaged(self, what: str) -> CheckpointError:
        return CheckpointError(f"Cannot read checkpoint {self.name!r}: a damaged pickle ({what})")

    def run(self) -> None:  # noqa: C901  one loop over the opcodes, branches by kind: the hot path
        """Replay one pickle, from the current position to its STOP."""
        buf, end, table = self.buf, self.end, _TABLE
        pos, ops, shared, marks = self.pos, 0, 0, 0
        stack: list[_Value | None] = []
        memo: dict[int, _Value] = {}
        while True:
            if pos >= end:
                raise self.damaged("truncated: it ends before its STOP")
            entry = table[buf[pos]]
            if entry is None:
                raise self.damaged(f"invalid load key {bytes([buf[pos]])!r}")
            pos += 1
            ops += 1
            if ops > MAX_OPS:
                self.refuse(f"more than {MAX_OPS:,} pickle operations", MAX_OPS)
            name, kind, popped, n, fmt, lines, is_int = entry
            index = text = 0
            start = pos
            if n > 0:
                if fmt is not None:
                    index = struct.unpack_from(fmt, buf, pos)[0] if pos + n <= end else 0
                pos += n
            elif n == pickletools.UP_TO_NEWLINE:
                for _ in range(lines):
                    stop = buf.find(b"\n", pos, min(end, pos + _LINE + 1))
                    if stop < 0:
                        raise self.damaged(f"{name}'s argument line is cut short or too long")
                    text += stop - pos
                    if name in ("GET", "PUT"):
                        try:
                            index = int(buf[pos:stop])
                        except ValueError:
                            raise self.damaged("a memo index that is not a number") from None
                    pos = stop + 1
                if name == "LONG" and text > MAX_INT_BYTES:
                    self.refuse(f"a number of {text:,} digits", MAX_INT_BYTES)
            elif n < 0:
                lfmt, width = fmt
                if pos + width > end:
                    raise self.damaged("truncated")
                text = struct.unpack_from(lfmt, buf, pos)[0]
                limit = MAX_INT_BYTES if is_int else MAX_STRING
                if text < 0 or text > limit:
                    self.refuse(f"a {'number' if is_int else 'string'} of {text:,} bytes", limit)
                pos += width + text
            if pos > end:
                raise self.damaged(f"truncated: {name} runs {pos - end:,} bytes past the end")
            if name in _KEPT:
                stack.append(_Value(1, text, leaf=True, payload=self.kept(name, start, pos, text)))
            elif kind == _SCALAR:
                stack.append(_LEAF if not text else _Value(1, text, leaf=True))
            elif kind == _TEXT:
                stack.append(_Value(1, text, leaf=True))
            elif kind == _EMPTY:
                stack.append(_Value(leaf=name == "EMPTY_TUPLE"))
            elif kind == _MARK_OP:
                stack.append(_MARK)
                marks += 1
                if marks > MAX_DEPTH:
                    self.refuse(f"values nested more than {MAX_DEPTH} levels deep", MAX_DEPTH)
            elif kind == _GET or kind == _DUP:
                value = memo.get(index) if kind == _GET else (stack[-1] if stack else None)
                if value is None:
                    raise self.damaged(f"memo entry {index} not found" if kind == _GET else "stack underflow")
                shared += 1
                if shared > MAX_SHARED:
                    self.refuse(f"more than {MAX_SHARED:,} shared references", MAX_SHARED)
                value.shared = True
                stack.append(value)
            elif kind == _PUT or kind == _MEMOIZE:
                if not stack or stack[-1] is None:
                    raise self.damaged("stack underflow")
                memo[len(memo) if kind == _MEMOIZE else index] = stack[-1]
            elif kind == _STOP:
                self.pos = pos
                return
            elif kind == _NONE:
                continue
            else:
                if kind == _COLLECT or kind == _FILL_MARK or kind == _POP_MARK:
                    items = self.to_mark(stack)
                    marks -= 1
                elif kind == _POP and stack and stack[-1] is None:
                    stack.pop()
                    marks -= 1
                    continue
                else:
                    if len(stack) < max(popped, 1) or None in stack[-max(popped, 1):]:
                        raise self.damaged("stack underflow")
                    items = stack[-popped:] if popped else [stack[-1]]
                    del stack[-max(popped, 1):]
                if kind == _COLLECT or kind == _COMBINE:
                    stack.append(self.made(items, name))
                elif kind == _FILL or kind == _FILL_MARK:
                    if not stack or stack[-1] is None:
                        raise self.damaged("stack underflow")
                    self.fill(stack[-1], items)
                # POP, POP_MARK: dropped

    def to_mark(self, stack: list[_Value | None]) -> list[_Value]:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is None:
                items = stack[i + 1:]
                del stack[i:]
                return items  # type: ignore[return-value]
        raise self.damaged("no mark")

    def kept(self, name: str, start: int, pos: int, text: int) -> object:
        """The value of a number, a short string or a global whose argument is ``buf[start:pos]``."""
        buf = self.buf
        try:
            if name in _BININTS:
                return struct.unpack_from(_BININTS[name], buf, start)[0]
            if name in ("LONG1", "LONG4"):
                return int.from_bytes(buf[pos - text:pos], "little", signed=True)
            if name in ("INT", "LONG"):
                return int(bytes(buf[start:pos - 1]).rstrip(b"L"))
            if name == "GLOBAL":
                module, _, attr = bytes(buf[start:pos - 1]).partition(b"\n")
                named = Global(module.decode("utf-8"), attr.decode("utf-8"))
                if self.globals is not None:
                    self.globals.add(named)
                return named
            if text > _KEPT_TEXT:
                return _UNKNOWN
            if name == "UNICODE":
                return bytes(buf[start:pos - 1]).decode("raw-unicode-escape")
            raw = bytes(buf[pos - text:pos])
            return raw if "BYTES" in name else raw.decode("utf-8")  # torch.load reads old strings as UTF-8
        except (ValueError, struct.error):
            return _UNKNOWN

    def made(self, items: list[_Value], name: str) -> _Value:
        value = _Value(1 + sum(i.values for i in items), sum(i.text for i in items),
                       1 + max(i.depth for i in items) if items else 0)
        self.check(value)
        if name in _TUPLES and len(items) <= _KEPT_ITEMS:
            value.payload = tuple(i.payload for i in items)
        elif name == "STACK_GLOBAL":
            if all(isinstance(i.payload, str) for i in items):
                value.payload = Global(*(i.payload for i in items))  # type: ignore[arg-type]
                if self.globals is not None:
                    self.globals.add(value.payload)
            else:  # built from values not kept: which global it names is not known
                self.globals = None
        elif name == "BINPERSID":
            declared = declared_storage(items[0].payload, _UNKNOWN, self.name)
            if declared is not None:
                self.storages.setdefault(*declared)
        return value

    def fill(self, target: _Value, items: list[_Value]) -> None:
        if target.leaf:
            raise self.damaged("items added to a value that takes none")
        if target.shared:
            raise CheckpointError(f"Refusing checkpoint {self.name!r}: a value that holds itself or is changed "
                                  "after it is shared (a state dict or training record never needs one)")
        target.values += sum(i.values for i in items)
        target.text += sum(i.text for i in items)
        target.depth = max([target.depth] + [i.depth + 1 for i in items])
        self.check(target)

    def check(self, value: _Value) -> None:
        if value.values > MAX_VALUES:
            self.refuse(f"{value.values:,} values counted as often as they are referenced", MAX_VALUES)
        if value.text > MAX_TEXT:
            self.refuse(f"{value.text:,} characters of text counted as often as they are referenced", MAX_TEXT)
        if value.depth > MAX_DEPTH:
            self.refuse(f"values nested {value.depth} levels deep", MAX_DEPTH)


def _replay(buf: bytes | mmap.mmap, size: int, name: str, pickles: int = 1) -> _Replay:
    """Replay up to ``pickles`` pickles one after another from the start of ``buf`` (``size`` bytes);
    the replay (its ``storages``: the bytes of each storage they declare, by key; its ``globals``)."""
    replay = _Replay(buf, min(size, len(buf)), name)
    for _ in range(pickles):
        if replay.pos >= replay.end:
            break  # a plain pickle, not torch.save's sequence: torch says so
        if replay.pos > MAX_PICKLE_BYTES:
            replay.refuse(f"pickles of more than {MAX_PICKLE_BYTES:,} bytes", MAX_PICKLE_BYTES)
        replay.run()
    return replay


def check_pickle_budget(path: str | Path, kind: str) -> frozenset[Global] | None:
    """Refuse a PyTorch file (``kind`` as ``container_format`` tells it) whose pickle passes a budget."""
    path = Path(path)
    if kind == "torch-zip":
        with zipfile.ZipFile(path) as archive:
            info = next((i for i in archive.infolist() if i.filename.endswith("data.pkl")), None)
            if info is None:
                return frozenset()  # no pickle: torch names what the archive lacks
            if info.file_size > MAX_PICKLE_BYTES:
                raise CheckpointError(f"Refusing checkpoint {path.name!r}: a pickle of {info.file_size:,} bytes "
                                      f"(at most {MAX_PICKLE_BYTES:,}); a checkpoint's values besides its tensors "
                                      "are bounded (see docs/reliability.md, security)")
            with archive.open(info) as member:
                data = member.read(info.file_size)
            records = {i.filename: i.file_size for i in archive.infolist()}
        replay = _replay(data, len(data), path.name)
        check_storage_sizes(path, replay.storages, records=records, prefix=info.filename[:-len("data.pkl")])
    elif kind == "pickle":
        size = path.stat().st_size
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            replay = _replay(buf, size, path.name, pickles=_LEGACY_PICKLES)  # the storages' bytes follow: not read
        check_storage_sizes(path, replay.storages, file_size=size)
    else:
        return frozenset()
    return None if replay.globals is None else frozenset(replay.globals)
