//! tonic's [`Connected`] for [`GatedIo`], so a [`crate::GatedListener`]'s
//! [`incoming`](crate::GatedListener::incoming) stream can be served by
//! `tonic::transport::Server::serve_with_incoming_shutdown` (the agent's xDS server). The
//! connection info is the wrapped stream's (`TcpConnectInfo`, `UdsConnectInfo`).

use tonic::transport::server::Connected;

use crate::io::GatedIo;

impl<S: Connected> Connected for GatedIo<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().connect_info()
    }
}
