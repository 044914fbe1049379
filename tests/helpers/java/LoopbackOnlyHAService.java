package rocketspark.test;

import org.apache.rocketmq.store.ha.DefaultHAService;

/**
 * DefaultHAService without the acceptor of slave connections (no listening socket).
 *
 * <p>RocketMQ 5.3's HA acceptor (haListenPort) binds all interfaces, and no option makes it
 * bind loopback. A master without slaves never needs it, so the test brokers get this HA
 * service instead: the store loads its HA service through ServiceProvider
 * (META-INF/service/org.apache.rocketmq.store.ha.HAService, looked up on the context class
 * loader), so this class and that file, first on the broker's classpath, replace
 * DefaultHAService. Everything else (group transfer, connection state notification) starts
 * as in DefaultHAService.start().
 */
public class LoopbackOnlyHAService extends DefaultHAService {
    @Override
    public void start() throws Exception {
        this.groupTransferService.start();
        this.haConnectionStateNotificationService.start();
    }
}
