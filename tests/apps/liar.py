"""An app that speaks nonsense to its supervisor on REKINDLE_SUPERVISOR_FD.
For each malformed message it expects an ERROR reply (type 199); prints how
many it got, then exits 0."""

import os
import socket
import struct

HDR = "<IHHII"  # magic, version, type, payload length, reserved
MAGIC = 0x4D534B52
ERROR = 199

BAD = [
    b"\x00" * 3,  # shorter than a header
    b"RKSM" * 100,  # right magic bytes, wrong version
    struct.pack(HDR, MAGIC, 1, 2, 999, 0),  # HELLO claiming a payload it lacks
    struct.pack(HDR, MAGIC, 1, 77, 0, 0),  # unknown type
    struct.pack(HDR, 0x12345678, 1, 1, 8, 0) + b"\x00" * 8,  # wrong magic
]


def main():
    s = socket.socket(fileno=int(os.environ["REKINDLE_SUPERVISOR_FD"]))
    s.settimeout(5)
    errors = 0
    for msg in BAD:
        s.send(msg)
        reply = s.recv(4096)
        errors += len(reply) >= 16 and struct.unpack(HDR, reply[:16])[2] == ERROR
    print("errors", errors, flush=True)


if __name__ == "__main__":
    main()
