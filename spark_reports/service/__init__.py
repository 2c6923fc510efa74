"""The Spark service: the session, the local Spark Connect server, the warm-up and the JVM's priority."""
