"""Pure decisions: values in, a decision out. No I/O, no clock (time is an argument)."""
