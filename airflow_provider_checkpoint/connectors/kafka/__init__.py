"""Apache Kafka: topics as a replayable source; the barrier is the partitions' end offsets."""
