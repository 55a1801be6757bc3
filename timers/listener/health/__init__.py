"""What a listener watches and tells: the server checked before it claims, a blocked event
loop, its peers, its runs over the last minute, its log lines and its trace spans."""
