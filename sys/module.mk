# sys/: what the library and the tools need of the system, done carefully for input from outside:
# opening files at paths a user names (input_file, output_file), secure mode (secure), bounded
# lock waits that ThreadSanitizer follows (timed_lock), text made safe to print (printable).
# Plain POSIX and C++, below config/ and telemetry/ (it includes nothing of the project). Its
# objects go into the config archive, the lowest one every program links after the pool's.
SYS_SRCS := $(wildcard sys/*.cpp)
