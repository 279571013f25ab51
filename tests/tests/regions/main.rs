//! Home-region routing over two DynamoDB Local servers. A binary of its own: it installs the process's
//! metrics recorder.

mod routing;
