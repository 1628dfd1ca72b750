"""horovodrun for shared runs (tests/lightcc/_launch.py's SharedRun): Horovod's own launcher,
whose rendezvous server also forgets every key on `DELETE /lightcc_reset/all`.

Horovod keeps the rendezvous keys of a process set's Gloo context after a shutdown; when ranks
initialize again with the same process sets, a rank may read a peer's address of the previous
initialization and time out connecting to it. The ranks of a shared run
(tests/lightcc/_case_runner.py) reset the server between cases, once all of them have shut down,
so that each initialization starts from the empty store a fresh horovodrun has.
"""

import sys
from http import HTTPStatus

from horovod.runner.http import http_server
from horovod.runner.launch import run_commandline

RESET_PATH = "/lightcc_reset/all"
_horovods_delete = http_server.RendezvousHandler.do_DELETE


def _delete(self):
  if self.path != RESET_PATH:
    return _horovods_delete(self)
  with self.server.cache_lock:
    self.server.cache.clear()
  with self.server.finished_list_lock:
    self.server.finished_list.clear()
  self.send_status_code(HTTPStatus.OK)


http_server.RendezvousHandler.do_DELETE = _delete

if __name__ == "__main__":
  sys.exit(run_commandline())
