"""The host kvgate and a server it launched share: how much of the server's CPUs other processes
took during a measurement (:mod:`kvgate.host.contention`)."""
