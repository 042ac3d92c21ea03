# Scenario for hwtests/guest/run: runs nvme-resv's real-device tests against the
# guest's nvmet namespace (hosts A and B of HWTEST_NVME_HOSTS).
#   hwtests/guest/run --scenario nvme-resv/tests/guest/device-tests.sh \
#     --add <static device test binary>=/usr/local/bin/nvme-resv-device-tests
# (see nvme-resv/tests/guest/run-device-tests for the whole sequence).
set -e
A=${HWTEST_NVME_HOSTS%%,*}
rest=${HWTEST_NVME_HOSTS#*,}
B=${rest%%,*}
export NVME_RESV_TEST_DEV=$A NVME_RESV_TEST_DEV2=$B NVME_RESV_BIN=/usr/local/bin/nvme-resv
export NVME_RESV_TEST_NORESV_DEV=${HWTEST_NVME_NORESV:-}
echo "device tests on A=$A B=$B"
/usr/local/bin/nvme-resv-device-tests --include-ignored --test-threads=1 --nocapture
