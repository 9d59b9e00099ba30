"""fencelog's wire protocol, sans-I/O: bytes in, messages out; messages in, bytes out."""
