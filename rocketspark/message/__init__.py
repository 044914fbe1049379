"""RocketMQ's vocabulary, shared by the embedded store and the wire.

Messages, hosts, topics and their flags (``model``); the CommitLog record grammar
(``record``) and the layout of its PROPERTIES field (``properties``); what a put,
a pull or a prepare answers (``results``); topic and group names and the tag
expression (``names``); records as Arrow batches, with the one row schema
(``arrow``); fastjson's JSON dialect (``fastjson``); and the byte gathering
behind the columnar paths (``byte_gather``). Nothing here imports the store, the
client or Spark: only :mod:`rocketspark.errors` (and numpy / pyarrow).
"""
