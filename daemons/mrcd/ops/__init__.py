"""Operations: the ``mrcd`` command (:mod:`.main`), Prometheus metrics (:mod:`.metrics`),
and a real Prometheus server for demos and tests (:mod:`.promserver`)."""
