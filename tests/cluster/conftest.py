# Ray reads some of these when it is imported (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER makes it keep
# 127.0.0.1), so they are set before any test here can import it. Loopback only; usage stats off;
# auth mode explicit.
from tests.cluster.harness import use_loopback_env

use_loopback_env()
