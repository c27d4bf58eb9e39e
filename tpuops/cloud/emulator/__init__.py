"""A local TPU v2 REST API emulator whose nodes are backed by real sshd servers on loopback."""
