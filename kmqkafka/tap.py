"""twistd plugin entry: Options and makeService (placeholder until the front door lands)."""
from twisted.application.service import MultiService
from twisted.python import usage


class Options(usage.Options):
    optParameters = [["data-dir", None, None, "data directory"]]


def makeService(options: Options) -> MultiService:
    return MultiService()
