"""Inline PTX for the emulator: every ``asm volatile(...)`` statement of a kernel source becomes
calls of the emulated instructions its exact text names.

An instruction is looked up by its full opcode with every qualifier
(``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16``); operands keep their meaning from the
statement's constraints (``"=r"`` outputs, ``"+f"`` read-write, ``"l"``/``"r"`` inputs,
``"n"`` immediates). An instruction the emulator does not know, or an operand form it does
not handle, is an `UnknownInstruction` at build time: nothing is ever skipped.

The replacement keeps the statement's line count, so compiler messages, printf and gdb point
at the original source lines.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass


class UnknownInstruction(ValueError):
    """An inline-PTX statement the emulator cannot execute (named with file and line)."""


@dataclass(frozen=True)
class Operand:
    constraint: str   # letters only: r, l, f, d, h, n
    expr: str
    output: bool      # "=" or "+"
    read: bool        # input, or "+"


_CTYPE = {"r": "uint32_t", "l": "uint64_t", "f": "float", "d": "double", "h": "uint16_t"}


@dataclass
class _Ctx:
    operands: list[Operand]
    where: str

    @property
    def site(self) -> int:
        """A number for this asm statement ("file:line"): lanes of a warp at two different
        .sync.aligned instructions are an error, which the runtime detects with it."""
        return zlib.crc32(self.where.encode()) & 0x7FFFFFFF

    def fail(self, msg: str) -> UnknownInstruction:
        return UnknownInstruction(f"{self.where}: {msg}")

    def _index(self, tok: str) -> int:
        m = re.fullmatch(r"%(\d+)", tok.strip())
        if not m or int(m.group(1)) >= len(self.operands):
            raise self.fail(f"operand {tok!r} is not one of %0..%{len(self.operands) - 1}")
        return int(m.group(1))

    def value(self, tok: str) -> str:
        """C expression for a source operand: %N, or an integer literal."""
        tok = tok.strip()
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
            return tok
        i = self._index(tok)
        op = self.operands[i]
        if op.constraint == "n":
            return f"({op.expr})"
        if op.output:
            if not op.read:
                raise self.fail(f"operand {tok} is a write-only output used as a source")
            return f"__o{i}"
        return f"__emu_ptx_{op.constraint}({op.expr})"

    def dest(self, tok: str, ctype: str) -> str:
        i = self._index(tok)
        op = self.operands[i]
        if not op.output:
            raise self.fail(f"operand {tok} is an input used as a destination")
        if _CTYPE.get(op.constraint) != ctype:
            raise self.fail(f"operand {tok} has constraint {op.constraint!r}; this "
                            f"instruction writes a {ctype}")
        return f"__o{i}"

    def vector(self, tok: str, n: int) -> list[str]:
        tok = tok.strip()
        if not (tok.startswith("{") and tok.endswith("}")):
            raise self.fail(f"expected a vector of {n} registers, given {tok!r}")
        items = [t.strip() for t in tok[1:-1].split(",")]
        if len(items) != n:
            raise self.fail(f"expected {n} registers in {tok!r}")
        return items

    def address(self, tok: str) -> str:
        m = re.fullmatch(r"\[\s*(%\d+)\s*(?:\+\s*(-?\d+)\s*)?\]", tok.strip())
        if not m:
            raise self.fail(f"expected an address [%N] or [%N+imm], given {tok!r}")
        base = self.value(m.group(1))
        return f"({base} + {m.group(2)})" if m.group(2) else base


def _cp_async(m: re.Match, args: list[str], ctx: _Ctx) -> str:
    level = 1 if m.group(1) == "cg" else 0
    if len(args) not in (3, 4):
        raise ctx.fail("cp.async takes [dst], [src], cp-size[, src-size]")
    cp_size = ctx.value(args[2])
    if level == 1 and re.fullmatch(r"\d+", args[2].strip()) and args[2].strip() != "16":
        raise ctx.fail("cp.async.cg supports cp-size 16 only")
    src_size = ctx.value(args[3]) if len(args) == 4 else cp_size
    return (f"__emu_ptx_cp_async(static_cast<uint32_t>({ctx.address(args[0])}), "
            f"static_cast<uint64_t>({ctx.address(args[1])}), (int)({cp_size}), "
            f"(int)({src_size}), {level});")


def _commit_group(m: re.Match, args: list[str], ctx: _Ctx) -> str:
    if args:
        raise ctx.fail("cp.async.commit_group takes no operands")
    return "__emu_ptx_cp_async_commit_group();"


def _wait_group(m: re.Match, args: list[str], ctx: _Ctx) -> str:
    if len(args) != 1:
        raise ctx.fail("cp.async.wait_group takes one immediate")
    return f"__emu_ptx_cp_async_wait_group((int)({ctx.value(args[0])}));"


def _wait_all(m: re.Match, args: list[str], ctx: _Ctx) -> str:
    if args:
        raise ctx.fail("cp.async.wait_all takes no operands")
    return "__emu_ptx_cp_async_wait_all();"


def _ldmatrix(m: re.Match, args: list[str], ctx: _Ctx) -> str:
    num, trans = int(m.group(1)), int(m.group(2) is not None)
    if len(args) != 2:
        raise ctx.fail("ldmatrix takes {registers}, [address]")
    regs = ctx.vector(args[0], num)
    out = " ".join(f"{ctx.dest(r, 'uint32_t')} = __r[{j}];" for j, r in enumerate(regs))
    return (f"{{ uint32_t __r[{num}]; __emu_ptx_ldmatrix(__r, {num}, {trans}, "
            f"static_cast<uint32_t>({ctx.address(args[1])}), {ctx.site}); {out} }}")


def _mma(m: re.Match, args: list[str], ctx: _Ctx) -> str:
    if m.group(1) != m.group(2):
        raise ctx.fail("mma.sync with different A and B types is not emulated")
    kind = "EMU_MMA_BF16" if m.group(1) == "bf16" else "EMU_MMA_F16"
    if len(args) != 4:
        raise ctx.fail("mma.sync takes {d}, {a}, {b}, {c}")
    d = [ctx.dest(r, "float") for r in ctx.vector(args[0], 4)]
    a = [ctx.value(r) for r in ctx.vector(args[1], 4)]
    b = [ctx.value(r) for r in ctx.vector(args[2], 2)]
    c = [ctx.value(r) for r in ctx.vector(args[3], 4)]
    out = " ".join(f"{x} = __d[{j}];" for j, x in enumerate(d))
    return (f"{{ uint32_t __a[4] = {{{', '.join(a)}}}; uint32_t __b[2] = {{{', '.join(b)}}}; "
            f"float __c[4] = {{{', '.join(c)}}}; float __d[4]; "
            f"__emu_ptx_mma_m16n8k16(__d, __a, __b, __c, {kind}, {ctx.site}); {out} }}")


#: Full opcodes (every qualifier) the emulator executes, and how.
INSTRUCTIONS: list[tuple[re.Pattern, Callable[[re.Match, list[str], _Ctx], str]]] = [
    (re.compile(r"cp\.async\.(ca|cg)\.shared(?:::cta)?\.global"), _cp_async),
    (re.compile(r"cp\.async\.commit_group"), _commit_group),
    (re.compile(r"cp\.async\.wait_group"), _wait_group),
    (re.compile(r"cp\.async\.wait_all"), _wait_all),
    (re.compile(r"ldmatrix\.sync\.aligned\.m8n8\.x([124])(\.trans)?\.shared(?:::cta)?\.b16"),
     _ldmatrix),
    (re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(f16|bf16)\.(f16|bf16)\.f32"),
     _mma),
]


# -- parsing ------------------------------------------------------------------------------

_ASM_RE = re.compile(r"\b(?:asm|__asm__|__asm)\b")


def _skip_literal(src: str, i: int) -> int:
    """Index just past the string or char literal starting at src[i]."""
    q = src[i]
    j = i + 1
    while j < len(src) and src[j] != q:
        j += 2 if src[j] == "\\" else 1
    return j + 1


def _match_paren(src: str, i: int) -> int:
    """Index of the ')' matching the '(' at src[i]."""
    depth = 0
    j = i
    while j < len(src):
        c = src[j]
        if c in "\"'":
            j = _skip_literal(src, j)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise ValueError("unbalanced parentheses")


def _split_top(s: str, sep: str) -> list[str]:
    """Split at `sep` outside strings, parentheses, brackets and braces."""
    parts, depth, start, j = [], 0, 0, 0
    while j < len(s):
        c = s[j]
        if c in "\"'":
            j = _skip_literal(s, j)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[start:j])
            start = j + 1
        j += 1
    parts.append(s[start:])
    return parts


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _string_literals(s: str, ctx_where: str) -> str:
    out, j = [], 0
    s = s.strip()
    while j < len(s):
        if s[j].isspace():
            j += 1
            continue
        if s[j] != '"':
            raise UnknownInstruction(f"{ctx_where}: the asm template must be string literals")
        end = _skip_literal(s, j)
        body = s[j + 1:end - 1]
        out.append(re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body))
        j = end
    return "".join(out)


def _operands(part: str, output: bool, where: str) -> list[Operand]:
    ops = []
    for item in _split_top(part, ","):
        item = item.strip()
        if not item:
            continue
        m = re.fullmatch(r'"([=+&]*)([a-z]+)"\s*\((.*)\)', item, re.S)
        if not m:
            raise UnknownInstruction(f"{where}: cannot read the asm operand {item!r}")
        mods, letter, expr = m.groups()
        if letter not in _CTYPE and letter != "n":
            raise UnknownInstruction(f"{where}: asm constraint {letter!r} is not emulated")
        ops.append(Operand(letter, expr.strip(), output, (not output) or "+" in mods))
    return ops


def translate_statement(body: str, where: str) -> str:
    """C++ for the inside of one ``asm volatile(body);`` statement."""
    parts = _split_top(body, ":")
    if len(parts) > 4:
        raise UnknownInstruction(f"{where}: asm goto is not emulated")
    template = _string_literals(parts[0], where)
    outputs = _operands(parts[1], True, where) if len(parts) > 1 else []
    inputs = _operands(parts[2], False, where) if len(parts) > 2 else []
    ctx = _Ctx(outputs + inputs, where)
    code = []
    for i, op in enumerate(ctx.operands):
        if op.output:
            init = f"__emu_ptx_{op.constraint}({op.expr})" if op.read else "0"
            code.append(f"{_CTYPE[op.constraint]} __o{i} = {init};")
    for text in template.split(";"):
        text = " ".join(text.split())
        if not text:
            continue
        if text.startswith(("{", "@", ".reg")):
            raise UnknownInstruction(f"{where}: PTX blocks, predicates and .reg declarations "
                                     f"are not emulated: {text!r}")
        opcode, _, rest = text.partition(" ")
        args = [a.strip() for a in _split_top(rest, ",")] if rest.strip() else []
        for pattern, emit in INSTRUCTIONS:
            m = pattern.fullmatch(opcode)
            if m:
                code.append(emit(m, args, ctx))
                break
        else:
            raise UnknownInstruction(f"{where}: the emulator does not know the PTX "
                                     f"instruction {opcode!r} (in {text!r})")
    for i, op in enumerate(ctx.operands):
        if op.output:
            code.append(f"({op.expr}) = __o{i};")
    return "{ " + " ".join(code) + " }"


def translate_source(src: str, filename: str) -> str:
    """`src` with every inline-PTX statement replaced (line count preserved)."""
    out, pos = [], 0
    scan = code_only(src)
    for m in _ASM_RE.finditer(scan):
        if m.start() < pos:
            continue
        j = m.end()
        while True:
            k = re.match(r"\s*(volatile|__volatile__|inline)\b", scan[j:])
            if not k:
                break
            j += k.end()
        k = re.match(r"\s*\(", scan[j:])
        if not k:
            continue
        open_at = j + k.end() - 1
        close_at = _match_paren(src, open_at)
        semi = re.match(r"\s*;", src[close_at + 1:])
        line = src.count("\n", 0, m.start()) + 1
        where = f"{filename}:{line}"
        if not semi:
            raise UnknownInstruction(f"{where}: an asm statement must end with ';'")
        end = close_at + 1 + semi.end()
        code = translate_statement(src[open_at + 1:close_at], where)
        out.append(src[pos:m.start()])
        out.append(code + "\n" * src.count("\n", m.start(), end))
        pos = end
    out.append(src[pos:])
    return "".join(out)


def code_only(src: str) -> str:
    """`src` with comments and literals blanked (same length), for keyword searches."""
    chars = list(src)
    j = 0
    while j < len(src):
        if src.startswith("//", j):
            end = src.find("\n", j)
            end = len(src) if end < 0 else end
        elif src.startswith("/*", j):
            end = src.find("*/", j + 2)
            end = len(src) if end < 0 else end + 2
        elif src[j] in "\"'":
            end = _skip_literal(src, j)
        else:
            j += 1
            continue
        for x in range(j, end):
            if chars[x] != "\n":
                chars[x] = " "
        j = end
    return "".join(chars)
