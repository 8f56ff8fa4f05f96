// The file the test binaries' shared precompiled header is compiled with (tests/CMakeLists.txt:
// retryd_test_pch). It has no code of its own.
