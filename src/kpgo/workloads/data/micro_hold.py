# micro's "server": holds two of the kernel's network static keys on for the whole run, so that no stressor turns
# them on or off during a measured window. Flipping a static key rewrites kernel text live (text_poke_bp), which
# under QEMU TCG with two vCPUs can race the other vCPU into "Oops: int3", and costs a flip's work in the window
# (docs/WORKLOADS.md, "micro").  Usage: python3 micro_hold.py PORT (accepts and closes connections on 127.0.0.1:PORT,
# the readiness probe's).
import socket
import sys

# Python's socket module has no names for these (x86-64 values)
SO_TIMESTAMP = 29  # asm-generic/socket.h, SO_TIMESTAMP_OLD
UDP_ENCAP = 100  # linux/udp.h

port = int(sys.argv[1])

# netstamp_needed_key: on while any inet socket wants receive timestamps. stress-ng's sock stressor asks SIOCGSTAMP
# on every connection, which turns the key on, and its close turns it off again whenever no other socket holds it.
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)

# udp_encap_needed_key: counted per UDP socket with UDP_ENCAP set; stress-ng's udp stressor sets it (to 0) on each of
# its sockets, so the first one turns the key on and the last close turns it off.
encap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
encap.setsockopt(socket.IPPROTO_UDP, UDP_ENCAP, 0)

listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(8)
print("micro_hold: netstamp and udp-encap keys held", flush=True)
while True:
    conn, _ = listener.accept()
    conn.close()
