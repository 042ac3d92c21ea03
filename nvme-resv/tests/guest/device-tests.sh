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
# The identity kind the guest's namespaces must be named by (Linux's order: nvmet gives
# every namespace a random UUID unless it is zeroed).
case ${HWTEST_NS_IDS:-nguid} in
  serial) export NVME_RESV_TEST_IDENTITY=vid-serial-model-nsid ;;
  *) export NVME_RESV_TEST_IDENTITY=uuid ;;
esac
echo "device tests: namespace identifiers ${HWTEST_NS_IDS:-nguid}, expecting $NVME_RESV_TEST_IDENTITY"
nvme-resv capabilities "$A" || true
nvme-resv capabilities "$A" -o json || true
nvme ns-descs "$A" || true
echo "device tests on A=$A B=$B"
/usr/local/bin/nvme-resv-device-tests --include-ignored --test-threads=1 --nocapture
