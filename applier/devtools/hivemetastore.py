"""A Hive Metastore (its Thrift service) on loopback, for the ``catalog: {kind: hive}`` tests: the metastore
Spark's own Hive client speaks to, run from the jars pyspark ships (``hive-metastore`` 2.3, DataNucleus,
Derby), with its database in Derby files under a work directory.

Why this one: it is the service other engines (Spark, Trino, Flink, Hive) look tables up in, reached
over Thrift (``hive.metastore.uris``), so a registration made by one process is seen by the next; no
download beyond pyspark.
"""

from __future__ import annotations

import glob
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from applier.devtools.servers import free_port, stop, wait_listening

__all__ = ["HiveMetastore", "start_hive_metastore"]

_SITE = """<configuration>
<property><name>javax.jdo.option.ConnectionURL</name><value>jdbc:derby:;databaseName={db};create=true</value></property>
<property><name>datanucleus.schema.autoCreateAll</name><value>true</value></property>
<property><name>hive.metastore.schema.verification</name><value>false</value></property>
<property><name>hive.metastore.warehouse.dir</name><value>{warehouse}</value></property>
<property><name>hive.async.log.enabled</name><value>false</value></property>
</configuration>
"""


@dataclass
class HiveMetastore:
    uri: str  # thrift://127.0.0.1:<port>
    warehouse: str  # where a database made without a location goes
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        stop(self.process, grace=5)


def start_hive_metastore(work: Path) -> HiveMetastore:
    """Start the metastore on a free loopback port, its Derby database and log in ``work``."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    if not glob.glob(str(jars / "hive-metastore-*.jar")):
        raise FileNotFoundError(f"no hive-metastore jar in {jars}: pyspark's Hive support is needed")
    conf = work / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    warehouse = work / "warehouse"
    (conf / "hive-site.xml").write_text(_SITE.format(db=work / "metastore_db", warehouse=warehouse))
    port = free_port()
    log_path = work / "metastore.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the server's output, for a failing test
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else Path("java")
    process = subprocess.Popen([str(java), "-Xmx512m", "-cp", f"{conf}{os.pathsep}{jars}/*",
                                "org.apache.hadoop.hive.metastore.HiveMetaStore", "-p", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, cwd=work)
    wait_listening(process, port, "the Hive Metastore", log_path, seconds=120)
    return HiveMetastore(f"thrift://127.0.0.1:{port}", str(warehouse), process)
