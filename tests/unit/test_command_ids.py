"""Command ids made without a system call: the same form as before, never repeated, not
repeated by a forked child either."""

from __future__ import annotations

import os
import re
import threading

from flowledger.infrastructure.engine.command_ids import CommandIds

FORM = re.compile(r"cmd-[0-9a-f]{32}")


def test_command_ids_have_the_old_form_and_never_repeat_across_threads() -> None:
    ids = CommandIds()
    made: list[list[str]] = [[] for _ in range(8)]

    def make(i: int) -> None:
        made[i].extend(ids() for _ in range(2_000))

    threads = [threading.Thread(target=make, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [command for batch in made for command in batch]
    assert len(set(every)) == len(every) == 16_000
    assert all(FORM.fullmatch(command) for command in every)


def test_two_generators_do_not_make_the_same_ids() -> None:
    # Each process draws its own key: the same counter gives other ids.
    assert len({CommandIds()() for _ in range(50)}) == 50


def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    ids = CommandIds()
    ids()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send its next ids, leave at once
        try:
            os.write(write, ",".join(ids() for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split(",")
    os.waitpid(pid, 0)
    parent = [ids() for _ in range(3)]
    assert len(child) == 3
    assert all(FORM.fullmatch(command) for command in child)
    assert not set(child) & set(parent)
