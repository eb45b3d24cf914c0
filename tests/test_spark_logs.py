"""Where Spark's own log lines go (docs/spark.md, "Spark's logs"): the session's settings send
them to ``spark.log`` in the data directory, whatever Java options ``--spark-conf`` gives.
No Spark is started here; tests/spark/test_spark_quiet.py starts one."""

from __future__ import annotations

import shlex

from warehouse.store.spark_session import JAVA_OPTIONS, LOG4J_OPTION, session_settings


def _log4j_config(java_options: str) -> str:
    [config] = [o.removeprefix(LOG4J_OPTION) for o in shlex.split(java_options) if o.startswith(LOG4J_OPTION)]
    return config


def test_spark_logs_go_to_a_file_in_the_data_dir(tmp_path):
    data_dir = tmp_path / "data dir"  # a space: the option is quoted
    settings = session_settings(tmp_path / "warehouse", host="127.0.0.1", log_dir=data_dir)
    options = settings[JAVA_OPTIONS]
    assert "-XX:TieredStopAtLevel=1" in shlex.split(options)  # the defaults stay
    config = _log4j_config(options)
    assert config == str((data_dir / "spark-log4j2.properties").resolve())
    text = (data_dir / "spark-log4j2.properties").read_text()
    assert f"appender.file.fileName = {(data_dir / 'spark.log').resolve()}" in text
    assert "rootLogger.appenderRef.file.ref = file" in text and "Console" not in text


def test_spark_conf_java_options_keep_the_log_file(tmp_path):
    # --spark-conf replaces the Java options (here: the optimizing JIT back on)...
    settings = session_settings(conf={JAVA_OPTIONS: "-XX:+UseG1GC"}, log_dir=tmp_path)
    options = shlex.split(settings[JAVA_OPTIONS])
    assert "-XX:+UseG1GC" in options and "-XX:TieredStopAtLevel=1" not in options
    assert _log4j_config(settings[JAVA_OPTIONS]) == str(tmp_path.resolve() / "spark-log4j2.properties")
    # ...and a configuration of the deployment's own is kept as it is
    own = f"-XX:+UseG1GC {LOG4J_OPTION}/etc/pvm/log4j2.properties"
    assert session_settings(conf={JAVA_OPTIONS: own}, log_dir=tmp_path)[JAVA_OPTIONS] == own


def test_without_a_log_dir_the_settings_are_as_before(tmp_path):
    assert LOG4J_OPTION not in session_settings(tmp_path / "warehouse")[JAVA_OPTIONS]
