"""Fuzzing of the AMQP frame reader/decoders and the connection+channel state machines."""
