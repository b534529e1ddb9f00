"""A large run's tables, shared by the Overview, Memory and Comm tabs: where the user is (`nav`),
the keys that move it (`keys`)."""
