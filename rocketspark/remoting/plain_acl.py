"""RocketMQ's plain ACL file, ``plain_acl.yml``: accounts, their permissions, white lists.

The format of Apache RocketMQ 5.3's ``PlainAccessData`` / ``PlainAccessConfig``
(``distribution/conf/plain_acl.yml``)::

    globalWhiteRemoteAddresses:      # requests from these hosts pass unchecked
      - 10.10.103.*
    accounts:
      - accessKey: RocketMQ          # longer than 6 characters
        secretKey: 12345678          # longer than 6 characters; never printed
        whiteRemoteAddress:          # requests of this account from here pass unchecked
        admin: false                 # true: every resource and the admin requests
        defaultTopicPerm: DENY       # DENY | PUB | SUB | PUB|SUB (missing: DENY)
        defaultGroupPerm: SUB
        topicPerms:
          - topicA=DENY
          - topicB=PUB|SUB
        groupPerms:
          - groupA=DENY

Read with a small reader of the YAML this file uses (no YAML dependency):
block mappings, block sequences of scalars or of mappings (indented under their
key or level with it, as RocketMQ's own rewrite of the file writes them),
comments, plain, single- and double-quoted scalars, and the flow forms ``[]``,
``{}`` and ``[a, b]`` (scalars only). Not supported, and refused with the line:
anchors and aliases (a plain scalar starting with ``*`` or ``&``: quote it),
tags, block scalars (``|``, ``>``), multi-line scalars, flow mappings with
content, several documents. Every scalar is read as its text (``12345678`` is
the string ``12345678``, as RocketMQ reads it into a String property).

Where this is stricter than RocketMQ (which would load the file and then deny
or ignore): an unknown key, a permission other than DENY, PUB, SUB, PUB|SUB or
SUB|PUB (RocketMQ reads it as DENY), an accessKey given twice (RocketMQ keeps
the last), and an address pattern this reader does not support stop the load
with :class:`~rocketspark.errors.AclFileError`, naming the file and line.

Address patterns (``globalWhiteRemoteAddresses``, ``whiteRemoteAddress``), as
RocketMQ's ``RemoteAddressStrategyFactory``: blank matches nothing; ``*``,
``*.*.*.*`` and ``*:*:*:*:*:*:*:*`` match every host; an IPv4 or IPv6 address
matches itself; ``a.b.c.*``, ``a.b.*.*``, ``a.*.*.*`` and a range in the first
wildcard place, ``a.b.c.10-20`` or ``a.b.10-20.*``, match IPv4 hosts;
``a,b,c`` and ``a.b.c.{1,2,3}`` list addresses. Not supported (refused):
IPv6 wildcards and ranges (``2001:db8::*``, ``...:1-200``) and IPv6 ``{...}``
lists.

The secret keys never appear in an error, a log line or a repr.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntFlag
from typing import Any, Literal

from rocketspark.errors import AclFileError

__all__ = [
    "ACL_FILE",
    "Account",
    "AddressPattern",
    "Perm",
    "PlainAcl",
    "check_permission",
    "load_plain_acl",
    "parse_perm",
    "parse_plain_acl",
    "read_yaml",
]

ACL_FILE = "plain_acl.yml"  # under the store's config/ directory
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"  # a group's resource is its retry topic
MIN_KEY_LENGTH = 7  # AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH: "longer than 6"


class Perm(IntFlag):
    """RocketMQ's ``Permission`` bits."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERMS = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
}


def parse_perm(text: str | None) -> Perm:
    """``DENY``, ``PUB``, ``SUB``, ``PUB|SUB`` or ``SUB|PUB`` as bits; None is DENY (RocketMQ's
    default). ValueError for anything else."""
    if text is None:
        return Perm.DENY
    perm = _PERMS.get(text.strip())
    if perm is None:
        raise ValueError(f"permission {text!r} is not one of {', '.join(_PERMS)}")
    return perm


def check_permission(needed: int, owned: int) -> bool:
    """Whether ``owned`` grants ``needed`` (``Permission.checkPermission``): DENY grants
    nothing; ANY is granted by PUB or SUB."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


# --- address patterns ----------------------------------------------------------------------


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _octet(text: str) -> int | None:
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    n = int(text)
    return n if 0 <= n <= 255 else None


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """Which client hosts a white-list entry admits (``RemoteAddressStrategy``).

    ``kind`` is ``none`` (blank: no host), ``all``, ``set`` (exact addresses) or
    ``range`` (IPv4: ``prefix`` octets, then the octet at ``len(prefix)`` in
    ``[low, high]``; later octets anything).
    """

    text: str
    kind: Literal["none", "all", "set", "range"]
    addresses: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address] = frozenset()
    prefix: tuple[int, ...] = ()
    low: int = 0
    high: int = 255

    @classmethod
    def parse(cls, text: str | None) -> AddressPattern:
        """The pattern of ``text``; ValueError naming what is wrong or unsupported."""
        if text is None or not text.strip():
            return cls("", "none")
        text = text.strip()
        if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(text, "all")
        if text.endswith("}"):
            head, brace, tail = text.partition("{")
            if not brace or ":" in text:
                raise ValueError(f"address list {text!r}: only IPv4 a.b.c.{{x,y}} is supported")
            return cls._set(text, [head + part for part in tail[:-1].split(",")])
        if "," in text:
            return cls._set(text, text.split(","))
        if "*" in text or "-" in text:
            if ":" in text:
                raise ValueError(f"address pattern {text!r}: IPv6 wildcards are not supported")
            return cls._range(text)
        return cls._set(text, [text])

    @classmethod
    def _set(cls, text: str, parts: list[str]) -> AddressPattern:
        addresses = set()
        for part in parts:
            ip = _ip(part)
            if ip is None:
                raise ValueError(f"address {part.strip()!r} of {text!r} is not an IP address")
            addresses.add(ip)
        return cls(text, "set", addresses=frozenset(addresses))

    @classmethod
    def _range(cls, text: str) -> AddressPattern:
        octets = text.split(".")
        bad = ValueError(
            f"address pattern {text!r}: expected a.b.c.*, a.b.*.*, a.*.*.* or a range "
            "such as a.b.c.1-100"
        )
        if len(octets) != 4:
            raise bad
        for i in range(1, 4):
            part = octets[i].strip()
            if part != "*" and "-" not in part:
                continue
            prefix = [_octet(o) for o in octets[:i]]
            if any(p is None for p in prefix) or any(o.strip() != "*" for o in octets[i + 1 :]):
                raise bad
            low, high = 0, 255
            if part != "*":
                lo, _, hi = part.partition("-")
                a, b = _octet(lo), _octet(hi)
                if a is None or b is None or a > b:
                    raise bad
                low, high = a, b
            return cls(
                text, "range", prefix=tuple(p for p in prefix if p is not None), low=low, high=high
            )
        raise bad

    def match(self, host: str) -> bool:
        """Whether ``host`` (an address, without port) is admitted."""
        kind = self.kind
        if kind == "all":
            return True
        if kind == "none":
            return False
        ip = _ip(host)
        if ip is None:
            return False
        if ip.version == 6 and ip.ipv4_mapped is not None:  # an IPv4 client of a dual-stack port
            ip = ip.ipv4_mapped
        if kind == "set":
            return ip in self.addresses
        if ip.version != 4:
            return False
        octets = ip.packed
        n = len(self.prefix)
        return tuple(octets[:n]) == self.prefix and self.low <= octets[n] <= self.high


# --- accounts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Account:
    """One account of the file. ``perms`` maps a topic, or a group's retry topic
    (``%RETRY%group``), to its permission; the repr never shows the secret."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern = AddressPattern("", "none")
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    perms: Mapping[str, Perm] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PlainAcl:
    """The accounts and global white list of one ``plain_acl.yml`` (``path``)."""

    path: str
    accounts: Mapping[str, Account] = field(default_factory=dict)
    global_white: tuple[AddressPattern, ...] = ()


_ACCOUNT_KEYS = (
    "accessKey",
    "secretKey",
    "whiteRemoteAddress",
    "admin",
    "defaultTopicPerm",
    "defaultGroupPerm",
    "topicPerms",
    "groupPerms",
)
_TOP_KEYS = ("globalWhiteRemoteAddresses", "accounts", "dataVersion")
_TRUE = ("true", "yes", "on")
_FALSE = ("false", "no", "off")


def load_plain_acl(path: str | os.PathLike[str]) -> PlainAcl:
    """Read and check ``path``; AclFileError naming the file and line when it is wrong."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise AclFileError(f"not UTF-8 text: {e.reason}", file=path) from None
    except OSError as e:
        raise AclFileError(f"cannot read it: {e.strerror}", file=path) from None
    return parse_plain_acl(text, path)


def parse_plain_acl(text: str, path: str = ACL_FILE) -> PlainAcl:
    """The accounts of a ``plain_acl.yml`` text (``path`` names it in errors)."""
    root = read_yaml(text, path)
    if root.value is None:  # an empty file: no account, every request is refused
        return PlainAcl(path)
    top = _mapping(root, path, "the file")
    _known(top, _TOP_KEYS, path, "the file")
    white = tuple(
        _pattern(item, path) for item in _scalars(top.get("globalWhiteRemoteAddresses"), path)
    )
    accounts: dict[str, Account] = {}
    for node in _items(top.get("accounts"), path, "accounts"):
        account = _account(node, path)
        if account.access_key in accounts:
            raise AclFileError(
                f"accessKey {account.access_key!r} is given twice", file=path, line=node.line
            )
        accounts[account.access_key] = account
    return PlainAcl(path, accounts, white)


def _account(node: Node, path: str) -> Account:
    entry = _mapping(node, path, "an account")
    _known(entry, _ACCOUNT_KEYS, path, "an account")
    access_key = _text(entry.get("accessKey"), path)
    secret_node = entry.get("secretKey")
    secret_key = _text(secret_node, path)
    if access_key is None or len(access_key) < MIN_KEY_LENGTH:
        raise AclFileError(
            f"an account's accessKey must be longer than {MIN_KEY_LENGTH - 1} characters",
            file=path,
            line=(entry.get("accessKey") or node).line,
        )
    if secret_key is None or len(secret_key) < MIN_KEY_LENGTH:
        raise AclFileError(
            f"the secretKey of accessKey {access_key!r} must be longer than "
            f"{MIN_KEY_LENGTH - 1} characters",
            file=path,
            line=(secret_node or node).line,
        )
    admin_node = entry.get("admin")
    admin_text = (_text(admin_node, path) or "false").lower()
    if admin_text not in _TRUE + _FALSE:
        assert admin_node is not None
        raise AclFileError(
            f"admin of accessKey {access_key!r} must be true or false",
            file=path,
            line=admin_node.line,
        )
    white_node = entry.get("whiteRemoteAddress")
    perms: dict[str, Perm] = {}
    for key, group in (("topicPerms", False), ("groupPerms", True)):
        for item in _scalars(entry.get(key), path):
            name, sep, perm = item.value.partition("=")
            if not sep or not name.strip() or "=" in perm:
                raise AclFileError(
                    f"{key} entry {item.value!r}: expected NAME=PERM, e.g. topicA=SUB",
                    file=path,
                    line=item.line,
                )
            resource = name.strip()
            perms[RETRY_GROUP_TOPIC_PREFIX + resource if group else resource] = _perm(
                item, perm, path
            )
    return Account(
        access_key,
        secret_key,
        _pattern(white_node, path) if white_node is not None else AddressPattern("", "none"),
        admin_text in _TRUE,
        _perm(entry.get("defaultTopicPerm"), None, path),
        _perm(entry.get("defaultGroupPerm"), None, path),
        perms,
    )


def _perm(node: Node | None, text: str | None, path: str) -> Perm:
    if node is None:
        return Perm.DENY
    try:
        return parse_perm(text if text is not None else _text(node, path))
    except ValueError as e:
        raise AclFileError(str(e), file=path, line=node.line) from None


def _pattern(node: Node, path: str) -> AddressPattern:
    try:
        return AddressPattern.parse(_text(node, path))
    except ValueError as e:
        raise AclFileError(str(e), file=path, line=node.line) from None


def _mapping(node: Node, path: str, what: str) -> dict[str, Node]:
    if not isinstance(node.value, dict):
        raise AclFileError(f"{what} must be a mapping of keys", file=path, line=node.line)
    return node.value


def _known(entry: dict[str, Node], known: tuple[str, ...], path: str, what: str) -> None:
    for key, node in entry.items():
        if key not in known:
            near = [k for k in known if k.lower() == key.lower()]
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(known)})"
            raise AclFileError(
                f"unknown key {key!r} in {what}{hint}", file=path, line=node.key_line
            )


def _items(node: Node | None, path: str, what: str) -> list[Node]:
    if node is None or node.value is None:
        return []
    if not isinstance(node.value, list):
        raise AclFileError(f"{what} must be a list", file=path, line=node.line)
    return node.value


def _scalars(node: Node | None, path: str) -> list[Node]:
    items = _items(node, path, "this value")
    for item in items:
        if not isinstance(item.value, str):
            raise AclFileError("expected a list of plain values", file=path, line=item.line)
    return items


def _text(node: Node | None, path: str) -> str | None:
    if node is None or node.value is None:
        return None
    if not isinstance(node.value, str):
        raise AclFileError("expected a plain value", file=path, line=node.line)
    return node.value


# --- the YAML subset -----------------------------------------------------------------------


@dataclass(slots=True)
class Node:
    """A value read from the file and the line it starts on (``key_line``: its key's).

    ``value`` is a str (a scalar), None (an empty value, ``~`` or ``null``), a
    dict of Nodes or a list of Nodes.
    """

    value: Any
    line: int
    key_line: int = 0


@dataclass(slots=True)
class _Line:
    number: int
    indent: int
    text: str  # without the indentation; may end with a comment


_UNSUPPORTED_START = {
    "&": "anchors are not supported",
    "*": "aliases are not supported (quote a value that starts with '*', e.g. '*')",
    "!": "tags are not supported",
    "|": "block scalars are not supported",
    ">": "block scalars are not supported",
    "%": "directives are not supported",
    "@": "a plain value cannot start with '@': quote it",
    "`": "a plain value cannot start with '`': quote it",
    "?": "complex keys are not supported",
}
_NULLS = ("", "~", "null", "Null", "NULL")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", '"': '"', "\\": "\\", "/": "/", " ": " "}


def read_yaml(text: str, path: str) -> Node:
    """Read the YAML subset of this module's docstring into Nodes (AclFileError naming
    ``path`` and the line when the text is outside it). An empty text is ``Node(None, 1)``."""
    return _Reader(text, path).read()


class _Reader:
    def __init__(self, text: str, path: str):
        self.path = path
        self.lines: list[_Line] = list(self._lines(text))
        self.i = 0

    def error(self, message: str, line: int) -> AclFileError:
        return AclFileError(message, file=self.path, line=line)

    def _lines(self, text: str) -> Iterator[_Line]:
        seen = False  # a line of content before this one
        for number, raw in enumerate(text.splitlines(), 1):
            stripped = raw.lstrip(" ")
            if not stripped.strip() or stripped.lstrip().startswith("#"):
                continue
            if stripped[0] == "\t":
                raise self.error("tabs cannot indent YAML", number)
            if stripped.startswith(("---", "...")) and stripped[3:4] in ("", " ", "\t"):
                rest = stripped[3:].strip()
                if stripped[0] == "-" and not seen and (not rest or rest.startswith("#")):
                    continue  # the start of the one document
                raise self.error("only one YAML document is supported", number)
            seen = True
            yield _Line(number, len(raw) - len(stripped), stripped.rstrip())

    def read(self) -> Node:
        if not self.lines:
            return Node(None, 1)
        first = self.lines[0]
        if first.indent != 0:
            raise self.error("the file's first line must not be indented", first.number)
        node = self._block(first.indent)
        if self.i < len(self.lines):
            line = self.lines[self.i]
            raise self.error("unexpected indentation", line.number)
        return node

    def _block(self, indent: int) -> Node:
        line = self.lines[self.i]
        if _is_item(line.text):
            return self._sequence(indent)
        return self._mapping(indent)

    def _sequence(self, indent: int) -> Node:
        start = self.lines[self.i].number
        items: list[Node] = []
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.indent != indent or not _is_item(line.text):
                if line.indent > indent:
                    raise self.error("unexpected indentation", line.number)
                break
            rest = line.text[1:]
            content = rest.lstrip(" ")
            if not content or content.startswith("#"):
                self.i += 1
                items.append(self._nested(indent, line.number, allow_level=False))
                continue
            column = indent + 1 + len(rest) - len(content)
            if _is_item(content) or _key_end(content) is not None:
                # "- key: value" (or "- - x"): a block starting on the dash's line; later
                # lines of it are indented to its first key.
                self.lines[self.i] = _Line(line.number, column, content)
                items.append(self._block(column))
            else:
                self.i += 1
                items.append(Node(self._scalar(content, line.number), line.number))
        return Node(items, start)

    def _mapping(self, indent: int) -> Node:
        start = self.lines[self.i].number
        entries: dict[str, Node] = {}
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.indent != indent:
                if line.indent > indent:
                    raise self.error("unexpected indentation", line.number)
                break
            if _is_item(line.text):
                raise self.error("a list item where a key was expected", line.number)
            end = _key_end(line.text)
            if end is None:
                raise self.error("expected 'key: value'", line.number)
            key = self._key(line.text[:end], line.number)
            if key in entries:
                raise self.error(f"key {key!r} is given twice", line.number)
            value = line.text[end + 1 :].lstrip(" ")
            self.i += 1
            if not value or value.startswith("#"):
                node = self._nested(indent, line.number, allow_level=True)
            else:
                node = Node(self._value(value, line.number), line.number)
            node.key_line = line.number
            entries[key] = node
        return Node(entries, start)

    def _nested(self, indent: int, number: int, *, allow_level: bool) -> Node:
        """The value of a key or dash with nothing after it: a deeper block, a list level
        with a key (YAML allows it), or None."""
        if self.i < len(self.lines):
            line = self.lines[self.i]
            if line.indent > indent:
                return self._block(line.indent)
            if allow_level and line.indent == indent and _is_item(line.text):
                return self._sequence(indent)
        return Node(None, number)

    def _key(self, text: str, number: int) -> str:
        text = text.strip()
        if text[:1] in ("'", '"'):
            key, rest = self._quoted(text, number)
            if rest.strip():
                raise self.error("text after a quoted key", number)
            return key
        if text[:1] in _UNSUPPORTED_START or text[:1] in "[{":
            raise self.error(f"unsupported key {text!r}", number)
        return text

    def _value(self, text: str, number: int) -> Any:
        if text[0] in "[{":
            return self._flow(text, number)
        return self._scalar(text, number)

    def _flow(self, text: str, number: int) -> Any:
        body = _cut_comment(text)
        if body in ("[]", "{}"):
            return [] if body == "[]" else None
        if body[0] != "[" or body[-1] != "]" or "{" in body or "[" in body[1:]:
            raise self.error(
                "flow collections other than [] {} and [a, b] are not supported", number
            )
        items = []
        for part in body[1:-1].split(","):
            part = part.strip()
            if not part:
                raise self.error("an empty item in a flow list", number)
            value = self._scalar(part, number)
            if value is None or not isinstance(value, str):
                raise self.error("an empty item in a flow list", number)
            items.append(Node(value, number))
        return items

    def _scalar(self, text: str, number: int) -> str | None:
        if text[0] in ("'", '"'):
            value, rest = self._quoted(text, number)
            rest = rest.strip()
            if rest and not rest.startswith("#"):
                raise self.error("text after a quoted value", number)
            return value
        if text[0] in _UNSUPPORTED_START:
            raise self.error(_UNSUPPORTED_START[text[0]], number)
        if text[0] in "[]{}":
            raise self.error("flow collections are supported as a whole value only", number)
        value = _cut_comment(text)
        if ": " in value or value.endswith(":"):
            raise self.error("a value cannot hold ': ' unless quoted", number)
        return None if value in _NULLS else value

    def _quoted(self, text: str, number: int) -> tuple[str, str]:
        """The quoted scalar at the start of ``text`` and what follows it."""
        quote = text[0]
        out: list[str] = []
        i = 1
        while i < len(text):
            c = text[i]
            if c == quote:
                if quote == "'" and text[i + 1 : i + 2] == "'":
                    out.append("'")
                    i += 2
                    continue
                return "".join(out), text[i + 1 :]
            if c == "\\" and quote == '"':
                i, char = self._escape(text, i, number)
                out.append(char)
                continue
            out.append(c)
            i += 1
        raise self.error("a quoted value does not end on its line", number)

    def _escape(self, text: str, i: int, number: int) -> tuple[int, str]:
        code = text[i + 1 : i + 2]
        if code in _ESCAPES:
            return i + 2, _ESCAPES[code]
        width = {"x": 2, "u": 4, "U": 8}.get(code)
        digits = text[i + 2 : i + 2 + width] if width else ""
        if width is None or len(digits) != width or not re.fullmatch("[0-9a-fA-F]+", digits):
            raise self.error("an unknown escape in a double-quoted value", number)
        return i + 2 + width, chr(int(digits, 16))


def _is_item(text: str) -> bool:
    return text == "-" or text.startswith(("- ", "-\t"))


def _key_end(text: str) -> int | None:
    """Where the ':' that ends a mapping key is in ``text`` (None: not a key)."""
    if text[:1] in ("'", '"'):
        quote = text[0]
        i = 1
        while i < len(text):
            if text[i] == quote:
                if quote == "'" and text[i + 1 : i + 2] == "'":
                    i += 2
                    continue
                if quote == '"' and text[i - 1] == "\\":
                    i += 1
                    continue
                j = i + 1
                while j < len(text) and text[j] == " ":
                    j += 1
                return j if text[j : j + 1] == ":" and text[j + 1 : j + 2] in ("", " ") else None
            i += 1
        return None
    m = re.search(r":(?=[ \t]|$)", text[: _comment_at(text)])
    return m.start() if m else None


def _comment_at(text: str) -> int:
    """Where a comment starts in a plain ``text`` (len(text) when none): a '#' after a space."""
    m = re.search(r"[ \t]#", text)
    return m.start() if m else len(text)


def _cut_comment(text: str) -> str:
    return text[: _comment_at(text)].rstrip()
