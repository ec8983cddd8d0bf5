# A listener that never accepts, its backlog filled: a connect to it gets no SYN-ACK and stays in SYN-SENT, as
# behind a firewall that drops packets. Prints its port, then holds until its stdin closes.
import socket
import sys

server = socket.socket()
server.bind(('127.0.0.1', 0))
server.listen(0)
fillers = []
for _ in range(4):
    filler = socket.socket()
    filler.setblocking(False)
    try:
        filler.connect(server.getsockname())
    except BlockingIOError:
        pass
    fillers.append(filler)
print(server.getsockname()[1], flush=True)
sys.stdin.read()
