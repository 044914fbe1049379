"""``plain_acl.yml``: the YAML subset reader, the accounts it yields, the address patterns,
and errors that name the file and line and never quote a secret.

``data/plain_acl.yml`` is RocketMQ 5.3.1's ``distribution/conf/plain_acl.yml`` as shipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketspark.errors import AclFileError, ConfigError
from rocketspark.remoting.plain_acl import (
    AddressPattern,
    Perm,
    check_permission,
    load_plain_acl,
    parse_perm,
    parse_plain_acl,
    read_yaml,
)

DATA = Path(__file__).resolve().parent / "data"
SECRET = "s3cr3t-never-shown"


def _plain(node):
    """Nodes as plain Python values."""
    if isinstance(node.value, dict):
        return {k: _plain(v) for k, v in node.value.items()}
    if isinstance(node.value, list):
        return [_plain(v) for v in node.value]
    return node.value


def test_rocketmq_sample_file() -> None:
    acl = load_plain_acl(DATA / "plain_acl.yml")
    assert sorted(acl.accounts) == ["RocketMQ", "rocketmq2"]
    assert [p.text for p in acl.global_white] == ["10.10.103.*", "192.168.0.*"]
    first = acl.accounts["RocketMQ"]
    assert first.secret_key == "12345678"  # an int in YAML, read as its text
    assert first.white_remote_address.kind == "none"
    assert not first.admin
    assert (first.default_topic_perm, first.default_group_perm) == (Perm.DENY, Perm.SUB)
    assert first.perms == {
        "topicA": Perm.DENY,
        "topicB": Perm.PUB | Perm.SUB,
        "topicC": Perm.SUB,
        "%RETRY%groupA": Perm.DENY,
        "%RETRY%groupB": Perm.PUB | Perm.SUB,
        "%RETRY%groupC": Perm.SUB,
    }
    second = acl.accounts["rocketmq2"]
    assert second.admin and second.white_remote_address.match("192.168.1.77")
    assert second.default_topic_perm == Perm.DENY  # not given: DENY, as RocketMQ


def test_the_layout_rocketmq_writes_back() -> None:
    # What RocketMQ's own update of the file writes (snakeyaml dumpAsMap): list items
    # level with their key, empty lists in flow form, dataVersion.
    text = """\
accounts:
- accessKey: writer01
  admin: false
  defaultGroupPerm: SUB
  defaultTopicPerm: DENY
  groupPerms: []
  secretKey: '12345678'
  topicPerms:
  - orders=PUB
  - "audit=PUB|SUB"
  whiteRemoteAddress: ''
dataVersion:
- counter: 3
  timestamp: 1700000000000
globalWhiteRemoteAddresses: [10.0.0.1, "10.0.1.*"]
"""
    acl = parse_plain_acl(text, "w.yml")
    account = acl.accounts["writer01"]
    assert account.perms == {"orders": Perm.PUB, "audit": Perm.PUB | Perm.SUB}
    assert account.secret_key == "12345678"
    assert [p.text for p in acl.global_white] == ["10.0.0.1", "10.0.1.*"]


def test_scalars_comments_and_quotes() -> None:
    text = """\
--- # a document start is fine
a: plain value   # a comment
b: 'it''s # not a comment'
c: "tab\\there \\u00e9 \\"q\\""
d: pass#word
e: ~
f:
g: it's
"quoted key": 1
h:
  - x   # first
  # a comment line between items
  -   y
  - - nested
i:
    deep: er
"""
    assert _plain(read_yaml(text, "t.yml")) == {
        "a": "plain value",
        "b": "it's # not a comment",
        "c": 'tab\there é "q"',
        "d": "pass#word",
        "e": None,
        "f": None,
        "g": "it's",
        "quoted key": "1",
        "h": ["x", "y", ["nested"]],
        "i": {"deep": "er"},
    }


def test_lines_of_a_multi_line_item_align_to_its_first_key() -> None:
    text = "list:\n  -   k1: a\n      k2: b\n  - k1: c\n"
    assert _plain(read_yaml(text, "t.yml")) == {"list": [{"k1": "a", "k2": "b"}, {"k1": "c"}]}


@pytest.mark.parametrize("text", ["", "\n# only a comment\n", "---\n"])
def test_an_empty_file_has_no_account(text: str) -> None:
    acl = parse_plain_acl(text, "empty.yml")
    assert acl.accounts == {} and acl.global_white == ()


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("a: 1\n\tb: 2\n", 2, "tabs"),
        ("a:\n  b: 1\n   c: 2\n", 3, "indentation"),
        ("a: 1\na: 2\n", 2, "twice"),
        ("a: *ref\n", 1, "aliases"),
        ("a: &x 1\n", 1, "anchors"),
        ("a: |\n  text\n", 1, "block scalars"),
        ("a: b: c\n", 1, "': '"),
        ("a: {b: 1}\n", 1, "flow"),
        ("a: 'open\n", 1, "does not end"),
        ("just text\n", 1, "key: value"),
        ("a: 1\n---\nb: 2\n", 2, "one YAML document"),
        ("  a: 1\n", 1, "indented"),
        ('a:\n- 1\nb: "\\q"\n', 3, "escape"),
    ],
)
def test_yaml_errors_name_the_file_and_line(text: str, line: int, says: str) -> None:
    with pytest.raises(AclFileError) as e:
        read_yaml(text, "bad.yml")
    assert e.value.file == "bad.yml" and e.value.line == line
    assert str(e.value).startswith(f"bad.yml, line {line}: ")
    assert says in str(e.value)
    assert isinstance(e.value, ConfigError)


def _account(**fields: str) -> str:
    body = {"accessKey": "account01", "secretKey": SECRET, **fields}
    return "accounts:\n  - " + "\n    ".join(f"{k}: {v}" for k, v in body.items()) + "\n"


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        (_account(secretKy="x"), 4, "unknown key 'secretKy'"),
        (_account(accesskey="x"), 4, "did you mean 'accessKey'"),
        (_account(defaultTopicPerm="READ"), 4, "permission 'READ'"),
        (_account(topicPerms="[orders]"), 4, "NAME=PERM"),
        (_account(admin="maybe"), 4, "true or false"),
        (_account(whiteRemoteAddress="10.0.*.5"), 4, "address pattern"),
        (_account(whiteRemoteAddress="2001:db8::*"), 4, "IPv6 wildcards"),
        (_account(whiteRemoteAddress="localhost"), 4, "not an IP address"),
        ("accounts:\n  - accessKey: short\n    secretKey: " + SECRET + "\n", 2, "accessKey"),
        ("accounts:\n  - accessKey: account01\n    secretKey: 123\n", 3, "longer than 6"),
        ("accounts:\n  - accessKey: account01\n", 2, "secretKey"),
        (_account() + "  - accessKey: account01\n    secretKey: other-secret\n", 4, "twice"),
        ("acounts: []\n", 1, "unknown key 'acounts'"),
        ("accounts: x\n", 1, "must be a list"),
        ("- a\n", 1, "mapping"),
    ],
)
def test_account_errors_name_the_line_and_not_the_secret(text: str, line: int, says: str):
    with pytest.raises(AclFileError) as e:
        parse_plain_acl(text, "acl.yml")
    assert e.value.line == line, str(e.value)
    assert says in str(e.value)
    assert SECRET not in str(e.value) and "123" not in str(e.value).split(": ", 1)[1]


def test_a_bad_quoted_secret_is_not_quoted_back(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(f"accounts:\n  - accessKey: account01\n    secretKey: '{SECRET}\n")
    with pytest.raises(AclFileError) as e:
        load_plain_acl(path)
    assert e.value.line == 3 and SECRET not in str(e.value)


def test_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_bytes(b"accounts: \xff\n")
    with pytest.raises(AclFileError, match="not UTF-8"):
        load_plain_acl(path)


def test_the_secret_is_not_in_any_repr() -> None:
    acl = parse_plain_acl(_account(), "acl.yml")
    assert SECRET not in repr(acl) and SECRET not in repr(acl.accounts["account01"])
    assert acl.accounts["account01"].secret_key == SECRET


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("", [], ["127.0.0.1", "::1"]),
        ("*", ["127.0.0.1", "::1"], []),
        ("*.*.*.*", ["10.1.2.3"], []),
        ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2", "::1"]),
        ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["127.0.0.1"]),
        (
            "10.10.103.*",
            ["10.10.103.0", "10.10.103.255", "::ffff:10.10.103.9"],
            ["10.10.104.1", "::1"],
        ),
        ("10.10.*.*", ["10.10.0.1", "10.10.200.3"], ["10.11.0.1"]),
        ("10.*.*.*", ["10.250.0.1"], ["11.0.0.1"]),
        ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.9", "192.168.1.21"]),
        ("192.168.1-2.*", ["192.168.2.77"], ["192.168.3.1"]),
        ("10.0.0.1,10.0.0.2", ["10.0.0.1", "10.0.0.2"], ["10.0.0.3"]),
        ("10.0.0.{1,3}", ["10.0.0.1", "10.0.0.3"], ["10.0.0.2"]),
    ],
)
def test_address_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    p = AddressPattern.parse(pattern)
    assert [h for h in yes if p.match(h)] == yes
    assert [h for h in no if p.match(h)] == []


@pytest.mark.parametrize("pattern", ["10.0.*.5", "10.0.0.20-10", "10.0.0", "1.2.3.300", "::1-2"])
def test_unsupported_or_wrong_address_patterns(pattern: str) -> None:
    with pytest.raises(ValueError):
        AddressPattern.parse(pattern)


def test_permissions() -> None:
    assert parse_perm(None) == Perm.DENY
    assert parse_perm(" PUB|SUB ") == parse_perm("SUB|PUB") == Perm.PUB | Perm.SUB
    with pytest.raises(ValueError):
        parse_perm("PUB,SUB")
    assert check_permission(Perm.PUB, Perm.PUB | Perm.SUB)
    assert not check_permission(Perm.PUB, Perm.SUB)
    assert not check_permission(Perm.SUB, Perm.DENY)
    assert check_permission(Perm.ANY, Perm.SUB) and not check_permission(Perm.ANY, Perm.DENY)
