// The target that builds tests/pch/test_pch.h's precompiled header for the test programs to reuse.
int main() { return 0; }
