# Runs a command on a pseudo-terminal of its own, as a terminal window runs a shell, and closes the terminal when
# a line "hangup" arrives on stdin: what closing the window (or losing the ssh connection) does to what runs in it.
#
#   python3 on-a-terminal.py session  COMMAND...   the terminal is the command's controlling terminal: closing it
#                                                  sends the command SIGHUP, and its writes fail with EIO after
#   python3 on-a-terminal.py detached COMMAND...   the command runs in a session of its own with the terminal as its
#                                                  stdout and stderr only (`setsid`): closing it sends no signal,
#                                                  only its writes fail with EIO after
#
# What the command writes to the terminal is passed on to this script's stdout. Its stderr gets one JSON line at
# the start, {"pid": N}, and one at the end, {"exit": code} or {"signal": number}.
# Node cannot open a pseudo-terminal without a native module; Python's standard library can.
import json
import os
import pty
import select
import sys


def report(**fields):
    sys.stderr.write(json.dumps(fields) + "\n")
    sys.stderr.flush()


def start(mode, command):
    if mode == "session":
        # forks with the terminal's other end as the child's controlling terminal, stdin, stdout and stderr
        pid, master = pty.fork()
        if pid == 0:
            os.execvp(command[0], command)
        return pid, master
    master, slave = os.openpty()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        os.close(master)
        os.close(slave)
        os.execvp(command[0], command)
    os.close(slave)
    return pid, master


def main():
    mode, command = sys.argv[1], sys.argv[2:]
    if mode not in ("session", "detached") or not command:
        sys.exit("usage: on-a-terminal.py session|detached COMMAND...")
    pid, master = start(mode, command)
    report(pid=pid)
    stdin = sys.stdin.fileno()
    watched = [master, stdin]
    # until the command's side closes, or the terminal is closed here
    while master in watched:
        readable, _, _ = select.select(watched, [], [])
        if master in readable:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the command's side has closed
                data = b""
            if not data:
                break
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        if stdin in readable:
            line = sys.stdin.readline()
            if not line:
                watched.remove(stdin)
            elif line.strip() == "hangup":
                break
    os.close(master)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        report(signal=os.WTERMSIG(status))
    else:
        report(exit=os.WEXITSTATUS(status))


main()
