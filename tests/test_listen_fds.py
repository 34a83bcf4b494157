"""rk_listen_fds(): the sockets `rekindle run --listen` (or systemd) hands
over are counted only when LISTEN_PID names this process."""

import json
import os
import subprocess

from supervisor_harness import SERVICE, free_port, service_command


def test_the_supervisors_socket_is_counted(supervise):
    sup = supervise()
    sup.wait_up(0)
    assert sup.state()["listen_fds"] == 1


def test_listen_fds_meant_for_another_process_are_not_ours(tmp_path):
    port = free_port()
    env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
    p = subprocess.Popen([SERVICE, "--port", str(port)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        state = json.loads(p.stdout.readline())
        assert state["listen_fds"] == 0, state
        assert service_command(port, "state")["listen_fds"] == 0, "it bound its own port instead"
    finally:
        p.kill()
        p.wait()
