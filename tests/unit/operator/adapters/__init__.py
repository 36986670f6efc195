"""adapters/: the I/O, against real sockets, stub servers or a real registry."""
