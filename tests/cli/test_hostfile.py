"""Hostfile parsing: literal expectations for good files, a line-numbered UsageError for each bad one."""

import os

import pytest
from support.jobs import ROOT as REPO

from bno_hvd.cli.hostfile import HostSlots, check_hosts_resolvable, parse_hostfile, total_slots, write_clean_hostfile
from bno_hvd.common.errors import UsageError


def write(tmp_path, text, name="hosts"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_comments_blank_lines_and_trailing_blank_line(tmp_path):
    path = write(tmp_path, "# cluster\n\nnode1 slots=2   # fast\n   \n\tnode2\tslots=4\n10.0.0.3 slots=1#x\n\n")
    hosts = parse_hostfile(path)
    assert hosts == [HostSlots("node1", 2), HostSlots("node2", 4), HostSlots("10.0.0.3", 1)]
    assert total_slots(hosts) == 7


def test_no_final_newline_and_crlf(tmp_path):
    assert parse_hostfile(write(tmp_path, "a slots=1\r\nb slots=3")) == [HostSlots("a", 1), HostSlots("b", 3)]


def test_clean_hostfile_is_what_horovodrun_parses(tmp_path):
    hosts = parse_hostfile(write(tmp_path, "# c\nnode1 slots=2 # x\n\nnode2 slots=4\n\n"))
    out = tmp_path / "clean"
    write_clean_hostfile(hosts, out)
    assert out.read_text() == "node1 slots=2\nnode2 slots=4\n"
    # horovodrun's parser: split()[0] and split('=')[1] of every line must work.
    assert [(line.split()[0], line.split("=")[1]) for line in open(out)] == [("node1", "2\n"), ("node2", "4\n")]
    assert parse_hostfile(out) == hosts


def test_shipped_hostfiles():
    assert parse_hostfile(os.path.join(REPO, "hostfiles", "localhost")) == [HostSlots("localhost", 4)]
    example = parse_hostfile(os.path.join(REPO, "hostfiles", "example-cluster"))
    assert example == [HostSlots("node1", 2), HostSlots("node2", 2)]


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("node1\n", 1, "missing 'slots=N'"),
        ("# c\nnode1 slots=2\nnode2 slots\n", 3, "unexpected 'slots'"),
        ("node1 slots=two\n", 1, "bad slot count 'two'"),
        ("node1 slots=0\n", 1, "bad slot count '0'"),
        ("node1 slots=-2\n", 1, "bad slot count '-2'"),
        ("node1 slots=\n", 1, "bad slot count ''"),
        ("node1 slots=1.5\n", 1, "bad slot count '1.5'"),
        ("\nnode1 slots=2\nnode1 slots=1\n", 3, "duplicate host 'node1' (first on line 2)"),
        ("node1 slots=2 max_slots=4\n", 1, "unexpected 'max_slots=4'"),
        ("node1 gpus=2\n", 1, "unexpected 'gpus=2'"),
        ("node1 slots = 2\n", 1, "unexpected 'slots'"),
        ("node1:2\n", 1, "write 'node1 slots=2'"),
        ("slots=2 node1\n", 1, "write the hostname first"),
        ("a,b slots=2\n", 1, "hostname 'a,b'"),
        ("fe80::1 slots=2\n", 1, "hostname 'fe80::1'"),
    ],
)
def test_bad_lines_name_the_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as err:
        parse_hostfile(path)
    message = str(err.value)
    assert message.startswith(f"hostfile {path} line {line}: ")
    assert words in message
    assert "\n" not in message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n   # another\n"])
def test_no_hosts(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(UsageError, match="no hosts in it; add lines like 'localhost slots=4'"):
        parse_hostfile(path)


def test_missing_unreadable_and_binary_files(tmp_path):
    with pytest.raises(UsageError, match="No such file or directory"):
        parse_hostfile(tmp_path / "nope")
    with pytest.raises(UsageError, match="cannot read it"):
        parse_hostfile(tmp_path)  # a directory
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00node")
    with pytest.raises(UsageError, match=f"hostfile {binary}: cannot read it"):
        parse_hostfile(binary)


def test_resolvable_hosts_pass_and_unknown_ones_are_named():
    check_hosts_resolvable([HostSlots("localhost", 2), "127.0.0.1"])
    with pytest.raises(UsageError) as err:
        # .invalid is reserved (RFC 2606): it never resolves.
        check_hosts_resolvable([HostSlots("localhost", 1), HostSlots("no-such-host.invalid", 2), "also-bad.invalid"])
    message = str(err.value)
    assert "'no-such-host.invalid'" in message and "'also-bad.invalid'" in message
    assert "localhost" not in message
