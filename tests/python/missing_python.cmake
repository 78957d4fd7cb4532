# Stands in for the capture_hf.py writer test when CMake found no /usr/bin/python3: the test
# fails with the reason instead of vanishing.
message(FATAL_ERROR "the capture_hf.py writer test needs /usr/bin/python3 with numpy and h5py "
                    "(Debian: python3 python3-numpy python3-h5py; scripts/install-deps.sh)")
