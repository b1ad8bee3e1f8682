"""A free TCP port on loopback for the rendezvous of process groups that tests spawn themselves."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
