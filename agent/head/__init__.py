"""Rank 0's services besides training: `Head` (services.py) and its relay half (relay_services.py),
which the watcher process imports without torch: hence `Head` is loaded only when asked for."""


def __getattr__(name: str):
    if name == "Head":
        from ringtop.agent.head.services import Head

        return Head
    raise AttributeError(name)
